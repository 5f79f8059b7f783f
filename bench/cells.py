"""Cells: a long benchmark as many small, independently kept runs.

A cell is one (task, row, seed) run. Each finished cell is its own results file,
``<folder>/<task>/<row>-s<seed>.json``, holding what the run returned plus the command, the
commit it ran at (and whether evoagent/ or bench/ had uncommitted changes there), the
environment it ran in (``environment``) and its wall time. A campaign that is killed, or whose machine is lent to other work, is started again and
runs only the missing cells. A campaign runs from a ``git worktree`` at one fixed commit, so
work on main cannot change the code under it, while its cells are written into main's results
folder (``--results``) and, with ``EVOAGENT_LAND_CELLS=1``, committed there as each finishes.

The summary built from the cells names that commit; a cell from any other commit is reported
as such (``plan``) and never mixed into a summary (``gather``). ``write_summary`` keeps, beside
the figures, the campaign record ``bench/stale.py`` checks: the commit, each cell file's hash,
and the bench/ code that summarized them. evoagent/ at HEAD may differ from the commit (the
summary says how: ``drift``); that is the campaign's point, not a stale result.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from code_graph import digest, manifest
from results_io import STARTED

ROOT = Path(__file__).resolve().parents[1]
LAND = "EVOAGENT_LAND_CELLS"  # set: each finished cell is committed in the checkout it is written to
PACKAGES = ("torch", "transformers", "reasoning-gym", "peft", "trl", "gepa", "numpy")


@dataclass(frozen=True, order=True)
class Cell:
    task: str
    row: str
    seed: int

    def path(self, folder: Path) -> Path:
        return folder / self.task / f"{self.row}-s{self.seed}.json"

    def __str__(self) -> str:
        return f"{self.task}/{self.row}-s{self.seed}"


def grid(tasks: Iterable[str], rows: Iterable[str], seeds: Iterable[int]) -> list[Cell]:
    """Every (task, row, seed), in the order a campaign runs them: seed by seed, so the first
    complete seed of every row comes early."""
    rows, tasks = list(rows), list(tasks)
    return [Cell(t, r, s) for s in seeds for t in tasks for r in rows]


def commit(root: Path = ROOT) -> tuple[str, bool]:
    """The commit the code at ``root`` is at, and whether evoagent/ or bench/ differ from it."""
    head = _git(root, "rev-parse", "HEAD")
    dirty = bool(_git(root, "status", "--porcelain", "--", "evoagent", "bench", "examples", "graphs"))
    return head, dirty


def work_dir(campaign: str, root: Path = ROOT) -> Path:
    """Where ``campaign`` keeps its unfinished runs, one folder per commit: a cell resumes only
    a run that its own code started, never one that a process at another commit (a profile, a
    run from another worktree) left half done, which would finish under this commit's name."""
    return Path.home() / ".cache" / "evoagent" / "campaigns" / campaign / commit(root)[0][:12]


def drift(since: str, root: Path = ROOT) -> str:
    """``git diff --stat`` of evoagent/ from ``since`` to the checkout's HEAD: what changed in
    the library since a campaign's commit ('' when nothing did)."""
    return _git(root, "diff", "--stat", since, "HEAD", "--", "evoagent")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


def package_versions(packages: Iterable[str]) -> dict[str, str]:
    """Each installed distribution's version, or "not installed"."""
    out = {}
    for pkg in packages:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def environment() -> dict[str, str]:
    """What a cell ran on besides the commit: Python, the package versions, the CPU and its
    thread count. A campaign's cells run over many days on fresh machines, each installing the
    newest releases that pyproject.toml admits; in the schedule campaign, one seed agent at one
    run seed scored differently from one day to the next, and nothing recorded why."""
    out = {"python": platform.python_version(), **package_versions(PACKAGES)}
    cpuinfo = Path("/proc/cpuinfo")
    names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
             if ln.startswith("model name")] if cpuinfo.is_file() else []
    out["cpu"] = names[0] if names else platform.processor() or platform.machine()
    out["threads"] = os.environ.get("OMP_NUM_THREADS", "all cores")
    return out


def environments(results: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The distinct environments that ``results`` (cells' files) ran in, each with its count of
    cells, most cells first (then in a fixed order); cells written before cells recorded one
    count as ``{}``."""
    groups: dict[str, dict[str, Any]] = {}
    for r in results:
        env = r.get("environment", {})
        groups.setdefault(json.dumps(env, sort_keys=True), {"environment": env, "cells": 0})["cells"] += 1
    return [g for _, g in sorted(groups.items(), key=lambda kv: (-kv[1]["cells"], kv[0]))]


def describe_environments(envs: Sequence[dict[str, Any]]) -> str:
    """``environments``' list in words, for a summary's markdown."""
    def one(env: dict[str, str]) -> str:
        if not env:
            return "not recorded"
        pkgs = ", ".join(f"{k} {v}" for k, v in env.items() if k not in ("cpu", "threads"))
        return f"{pkgs}; {env.get('cpu', '?')}, threads {env.get('threads', '?')}"
    if len(envs) == 1 and not envs[0]["environment"]:
        return "did not record their environment (they predate that record)"
    if len(envs) == 1:
        return f"ran in one environment: {one(envs[0]['environment'])}"
    return f"ran in {len(envs)} environments: " + "; ".join(
        f"{e['cells']} cell(s) in ({one(e['environment'])})" for e in envs)


def write(folder: Path, cell: Cell, result: dict[str, Any], command: str, seconds: float) -> Path:
    """Keep a finished cell (atomically: a kill leaves the old state, never half a file). Its
    ``wall_s`` is ``seconds``, the cell's own time, even where ``result`` has a ``wall_s`` of
    its own (a row's run reports its last stretch only)."""
    head, dirty = commit()
    data = {"cell": {"task": cell.task, "row": cell.row, "seed": cell.seed}, "command": command,
            "commit": head, "dirty": dirty, "environment": environment(), **result,
            "wall_s": round(seconds, 1)}
    dest = cell.path(folder)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, dest)
    if os.environ.get(LAND):
        land(dest, f"{folder.name} cell {cell} (ran at {head[:10]})")
    return dest


@contextlib.contextmanager
def stopwatch(folder: Path, every_s: float = 30.0) -> Iterator[Callable[[], float]]:
    """The seconds a cell has run in its run ``folder``, over every stretch: the total so far is
    saved there every ``every_s`` seconds and on leaving, and a resumed run starts from it. A
    campaign's cell is killed whenever a stretch of work ends and resumed in the next, so the
    time of its last stretch alone (what a cell reported before this) was a fraction of its cost."""
    saved = folder / "elapsed_s"
    before = float(saved.read_text()) if saved.is_file() else 0.0
    start = time.perf_counter()
    total = lambda: before + time.perf_counter() - start  # noqa: E731
    done = threading.Event()

    def save() -> None:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = saved.with_name(saved.name + ".tmp")
        tmp.write_text(f"{total():.1f}")
        os.replace(tmp, saved)

    def beat() -> None:
        while not done.wait(every_s):
            save()

    thread = threading.Thread(target=beat, name="cell-stopwatch", daemon=True)
    thread.start()
    try:
        yield total
    finally:
        done.set()
        thread.join()
        save()


def spawn(folder: Path, cell: Cell, argv: list[str], what: str = "") -> dict[str, Any]:
    """Run one cell as its own process (``argv``: the script and its ``--cell`` arguments) and
    return what it kept in ``folder``. A cell that fails stops the campaign (exit 2) with the
    cells before it kept, so the next run starts from it."""
    print(f"== {cell}{what}", flush=True)
    code = os.spawnv(os.P_WAIT, sys.executable, [sys.executable, *argv])
    if code != 0:
        print(f"cell {cell} failed (exit {code}); the cells before it are kept", file=sys.stderr)
        sys.exit(2)
    data = read(folder, cell)
    if data is None:
        print(f"cell {cell} ended without keeping its file in {folder}", file=sys.stderr)
        sys.exit(2)
    return data


def chain(cell: Cell) -> str:
    """The chain a cell belongs to: a (task, seed)'s cells, which may need one another (the
    headline's rows start from its seed row's agent and spend its joint row's budget), so one
    lane runs them in grid order."""
    return f"{cell.task}:{cell.seed}"


def deal(work: Sequence[Cell], lanes: int) -> list[list[str]]:
    """The chains of the cells that need running, dealt round-robin into ``lanes`` lists
    (fewer when there are fewer chains)."""
    chains = list(dict.fromkeys(chain(c) for c in work))
    return [chains[k::lanes] for k in range(min(lanes, len(chains)))]


def in_chains(cells: Sequence[Cell], chains: str | None) -> list[Cell]:
    """The cells of a lane's ``--chains`` (comma-separated, as ``run_lanes`` passes them), in
    their order; all of them when None."""
    if chains is None:
        return list(cells)
    mine = set(chains.split(","))
    return [c for c in cells if chain(c) in mine]


def run_lanes(argv: list[str], dealt: list[list[str]]) -> None:
    """Run a campaign's chains as parallel lanes: one process per list in ``dealt``, this
    script with its own arguments (``argv``) and ``--chains``, each given an equal share of
    this process's CPUs as torch threads (a small model's decode, much of it Python, keeps few
    threads busy, so lanes use cores one process leaves idle). No figure depends on how many
    lanes ran: budgets count completions, not seconds. Waits for every
    lane; if any failed, exits 2 after the others finish (their cells are kept)."""
    threads = str(max(1, len(os.sched_getaffinity(0)) // max(len(dealt), 1)))
    env = os.environ | {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    procs = []
    for k, chains in enumerate(dealt):
        print(f"== lane {k}: {', '.join(chains)} ({threads} thread(s))", flush=True)
        procs.append(subprocess.Popen([sys.executable, *argv, "--chains", ",".join(chains)], env=env))
    failed = [k for k, p in enumerate(procs) if p.wait() != 0]
    if failed:
        print(f"lane(s) {failed} failed; the cells every lane finished are kept", file=sys.stderr)
        sys.exit(2)


def add_lane_args(ap: argparse.ArgumentParser) -> None:
    """``--lanes N`` for a campaign script, and the ``--chains`` its lanes are started with."""
    ap.add_argument("--lanes", type=int, default=1,
                    help="run the missing cells' (task, seed) chains in N processes at once, the CPUs shared")
    ap.add_argument("--chains", help=argparse.SUPPRESS)


def run_missing(folder: Path, missing: Sequence[Cell], args: argparse.Namespace,
                argv_of: Callable[[Cell], list[str]], what: str = "") -> bool:
    """Run the ``missing`` cells one process each (``argv_of(cell)``: the script and its
    ``--cell`` arguments): all of them here, or, under ``--lanes N``, dealt to N lanes; in a
    lane, only its chains. True when this process is the campaign itself (it may summarize
    now), False in a lane (the campaign that started it summarizes)."""
    if args.chains is None and args.lanes > 1:
        run_lanes(sys.argv, deal(missing, args.lanes))
        return True
    for cell in in_chains(missing, args.chains):
        spawn(folder, cell, argv_of(cell), what)
    return args.chains is None


def land(path: Path, message: str, tries: int = 20) -> None:
    """Commit ``path`` alone in the checkout that holds it (``git commit --only``: what anyone
    staged for other paths stays staged), retrying while another git command holds the index;
    on any other failure the file is unstaged again and left for a person to commit."""
    root = Path(_git(path.parent, "rev-parse", "--show-toplevel"))
    for _ in range(tries):
        add = subprocess.run(["git", "add", "--", str(path)], cwd=root, capture_output=True, text=True)
        done = add if add.returncode else subprocess.run(
            ["git", "commit", "-q", "--only", "-m", message, "--", str(path)], cwd=root, capture_output=True, text=True)
        if done.returncode == 0:
            return
        if "index.lock" not in done.stderr:
            break
        time.sleep(3)
    subprocess.run(["git", "reset", "-q", "--", str(path)], cwd=root, capture_output=True)
    print(f"could not commit {path}: commit it by hand", flush=True)


def read(folder: Path, cell: Cell) -> dict[str, Any] | None:
    path = cell.path(folder)
    return json.loads(path.read_text()) if path.is_file() else None


@dataclass
class Plan:
    """Where a campaign stands: its cells done at the campaign's commit, those done at another
    commit (shown, never summarized), and those missing, with an estimate of the hours left.
    Each done cell's mean test reward is shown as it stands, so a campaign of many days can be
    watched as it goes; the summary's intervals wait for every cell."""

    done: list[Cell]
    other: dict[Cell, str]  # cell -> the commit it ran at
    missing: list[Cell]
    hours_left: float
    scores: dict[Cell, float] = field(default_factory=dict)  # done cell -> its mean test reward

    def describe(self) -> str:
        lines = [f"{len(self.done)} done, {len(self.missing)} missing, {len(self.other)} from "
                 f"another commit; about {self.hours_left:.1f} h of CPU left"]
        lines += [f"  done     {c}: {self.scores[c]:.3f}" for c in self.done]
        lines += [f"  missing  {c}" for c in self.missing]
        lines += [f"  other    {c} (ran at {sha[:10]})" for c, sha in self.other.items()]
        return "\n".join(lines)


def plan(folder: Path, cells: Sequence[Cell], at: str | None, guess_s: Callable[[Cell], float]) -> Plan:
    """Sort ``cells`` into done (at commit ``at``; any commit when None), from another commit,
    and missing. The hours left are the mean wall time of the done cells of the same row, or
    ``guess_s(cell)`` for a row with none done yet."""
    done, other, missing, scores = [], {}, [], {}
    walls: dict[str, list[float]] = {}
    for c in cells:
        data = read(folder, c)
        if data is None:
            missing.append(c)
        elif at is not None and data["commit"] != at:
            other[c] = data["commit"]
            missing.append(c)
        else:
            done.append(c)
            scores[c] = sum(data["per_input"].values()) / max(len(data["per_input"]), 1)
            walls.setdefault(c.row, []).append(float(data["wall_s"]))
    seconds = sum(sum(walls[c.row]) / len(walls[c.row]) if c.row in walls else guess_s(c) for c in missing)
    return Plan(done, other, missing, seconds / 3600, scores)


def gather(folder: Path, cells: Sequence[Cell], at: str, dirty_ok: bool = False) -> dict[Cell, dict[str, Any]]:
    """Every cell's result, all from commit ``at``; refuses a missing cell or one from another
    commit (``SystemExit`` naming it), so a summary never mixes code silently. A cell run with
    uncommitted changes is refused too, unless ``dirty_ok`` (a wiring check, not figures)."""
    out = {}
    for c in cells:
        data = read(folder, c)
        if data is None:
            raise SystemExit(f"cell {c} is missing: run the campaign to the end first")
        if data["commit"] != at or (data.get("dirty") and not dirty_ok):
            state = f"at {data['commit'][:10]}" if data["commit"] != at else "with uncommitted changes"
            raise SystemExit(f"cell {c} ran {state}, not at the campaign's commit {at[:10]}: "
                             "run it again (delete its file) or name its commit")
        out[c] = data
    return out


def campaign_commit(folder: Path, cells: Sequence[Cell], root: Path = ROOT) -> str | None:
    """The campaign's commit, unless ``--commit`` says: the newest (by commit time) that a done
    cell ran at. A campaign restarted at a later commit runs every cell again, so until it
    catches up, the cells it has yet to replace outnumber its own and must not outvote it.
    Among commits this repository lacks, or made in the same second, most cells win."""
    seen: dict[str, int] = {}
    for c in cells:
        if (data := read(folder, c)) is not None:
            seen[data["commit"]] = seen.get(data["commit"], 0) + 1

    def when(sha: str) -> int:
        try:
            return int(_git(root, "show", "-s", "--format=%ct", sha))
        except subprocess.CalledProcessError:
            return -1

    return max(seen, key=lambda k: (when(k), seen[k])) if seen else None


def summary_commit(given: str | None, folder: Path, cells: Sequence[Cell], root: Path = ROOT) -> str:
    """The commit a ``--plan`` or ``--summarize`` speaks of: ``--commit`` if given (any name
    git knows: a short hash, a tag; cells record the full hash), else the campaign's
    (``campaign_commit``), else this checkout's HEAD (no cell has run yet)."""
    if not given:
        return campaign_commit(folder, cells, root) or commit(root)[0]
    try:
        return _git(root, "rev-parse", "--verify", "--quiet", f"{given}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"--commit: {given!r} names no commit in this repository") from None


def write_summary(
    dest: Path, figures: dict[str, Any], folder: Path, cells: Sequence[Cell], at: str, script: Path
) -> Path:
    """Write a campaign's summary ``dest`` with its record: ``campaign`` (the commit, each cell
    file's hash, by path relative to ``dest``'s folder, and the environments the cells ran in)
    and ``code`` (the bench/ files of
    ``script``, the one that turned the cells into figures; evoagent/ ran at the commit)."""
    raw = {str(c.path(folder).resolve().relative_to(dest.parent.resolve())): c.path(folder).read_bytes()
           for c in cells}
    code = {p: h for p, h in manifest(script, (), STARTED).items() if p.startswith("bench/")}
    record = {"commit": at, "evoagent_changed_since": drift(at), "cells": {k: digest(b) for k, b in raw.items()},
              "environments": environments(json.loads(b) for b in raw.values())}
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps({**figures, "campaign": record, "code": code}, indent=2) + "\n")
    print(f"wrote {dest}")
    return dest


def campaign_problems(summary: Path, record: dict[str, Any], root: Path = ROOT) -> list[str]:
    """What no longer holds of a campaign summary's record (empty: it stands): a cell file
    changed or gone, a cell that says another commit, or a commit that is not in HEAD's
    history."""
    out = []
    for rel, recorded in record["cells"].items():
        f = summary.parent / rel
        if not f.is_file():
            out.append(f"its cell {rel} is gone")
        elif digest(raw := f.read_bytes()) != recorded:
            out.append(f"its cell {rel} changed since the summary")
        elif json.loads(raw)["commit"] != record["commit"]:
            out.append(f"its cell {rel} ran at another commit than {record['commit'][:10]}")
    known = subprocess.run(["git", "merge-base", "--is-ancestor", record["commit"], "HEAD"], cwd=root,
                           capture_output=True).returncode == 0
    if not known:
        out.append(f"its commit {record['commit'][:10]} is not in HEAD's history")
    return out
