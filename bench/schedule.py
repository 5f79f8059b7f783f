"""Does the adaptive schedule spend a joint run's budget better than a phase every N generations?

Three arms per task and run seed, at the same budget of model completions (``evolve.max_calls``,
policy and mutator together; the search ends when it is spent, on a search generation):

- ``evolve``: program search alone (``rl.enabled: false``);
- ``fixed``: joint, ``rl.schedule: fixed`` (a phase every ``rl.every`` generations, as the task
  is written);
- ``adaptive``: joint, ``rl.schedule: adaptive``.

Every arm runs the task's policy and mutator (the embedded SmolLM2-135M-Instruct unless the task
says otherwise) with rollback on, and tests its best agent once on the test split. The run seed
seeds the splits, the search and the RL.

Each (task, arm, seed) is a cell (``bench/cells.py``): its own process, its own results file
``bench/results/schedule/<task>/<arm>-s<seed>.json`` with every test input's reward, and its
own archive under ``--work``, so a killed campaign resumes inside the cell it was running. Run it
from a ``git worktree`` at one commit, writing into main's results::

    git worktree add ../campaign HEAD
    cd ../campaign && python bench/schedule.py --results /path/to/main/bench/results/schedule
    python bench/schedule.py --plan     # done and missing cells, hours left
    python bench/schedule.py --summarize  # schedule.json and .md beside --results, once every cell is in

The summary compares arms per task by a two-level bootstrap (seeds, then test inputs within a
seed, paired across arms: ``headline.bootstrap``) and names the commit the cells ran at, with
``git diff --stat`` of evoagent/ from there to HEAD. The adaptive schedule should become the
default if it is better than fixed (95% CI of the difference above 0) on at least one task and
worse (CI below 0) on none; the summary says which holds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import cells
import numpy as np
from results_io import RESULTS

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("evolve", "fixed", "adaptive")
TASKS = {"gcd": "examples/gcd/task.yaml", "sums": "examples/sums/task.yaml",
         "basic_arithmetic": "examples/basic_arithmetic/task.yaml"}  # the last from the split screen
BUDGET = 2000  # completions per run: the headline campaign's joint budget (--joint-budget), so the
# schedule it picks is measured at the budget it will run at
SEARCHES = 200  # generations: the budget, not this, ends every arm
GUESS_S = {"evolve": 900.0, "fixed": 1500.0, "adaptive": 1200.0}  # before any cell of the arm ran
FOLDER = RESULTS / "schedule"


def spec_for(task: str, arm: str, seed: int, budget: int, out: Path) -> Any:
    """The task's spec as ``arm`` runs it at run seed ``seed`` and ``budget`` completions."""
    from evoagent.check import check_spec
    from evoagent.spec import load_spec
    from evoagent.spec.config import RunSpec

    d = load_spec(ROOT / task).model_dump(mode="json")
    d |= {"seed": seed, "output": str(out), "name": f"{Path(task).parent.name}-{arm}-s{seed}"}
    d["evolve"] |= {"generations": SEARCHES, "max_calls": budget}
    if arm == "evolve":
        d["rl"]["enabled"] = False
    else:
        d["rl"] |= {"enabled": True, "schedule": arm}
    spec = RunSpec.model_validate(d)
    check_spec(spec)
    return spec


def run_cell(task: str, arm: str, seed: int, budget: int) -> dict[str, Any]:
    """One cell in this process (the run resumed if its archive exists), with its steps."""
    sys.path.insert(0, str(Path(__file__).parent))
    from headline import run_search

    spec = spec_for(task, arm, seed, budget, cells.work_dir("schedule") / Path(task).parent.name)
    return run_search(spec) | {"budget": budget}


def campaign(task_names: list[str], seeds: list[int]) -> list[cells.Cell]:
    return cells.grid(task_names, ARMS, seeds)


def phase_generations(run: dict[str, Any]) -> list[int]:
    """After which generations a run trained: what a schedule decides, whatever its searches drew."""
    return [step["generation"] for step in run.get("steps", []) if step["kind"] == "rl"]


def summarize(folder: Path, grid: list[cells.Cell], at: str) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    from headline import bootstrap, interval, paired

    got = cells.gather(folder, grid, at)
    out: dict[str, Any] = {"commit": at, "evoagent_changed_since": cells.drift(at), "tasks": {}}
    out["budget"] = max((r.get("budget", 0) for r in got.values()), default=0)
    out["environments"] = cells.environments(got.values())
    for task in sorted({c.task for c in grid}):
        seeds = sorted({c.seed for c in grid if c.task == task})
        runs_of = {arm: {s: got[cells.Cell(task, arm, s)] for s in seeds} for arm in ARMS}
        per_seed = {s: vals for s, (_, vals) in paired(runs_of, "evolve").items()}
        boot = bootstrap(per_seed, np.random.default_rng(0))
        rows = {}
        for arm in ARMS:
            runs = list(runs_of[arm].values())
            rows[arm] = {
                "test": round(float(np.mean([per_seed[s][arm].mean() for s in seeds])), 3),
                "ci": interval(boot[arm]),
                "per_seed": {str(s): round(float(per_seed[s][arm].mean()), 3) for s in seeds},
                "calls": round(float(np.mean([r["calls"] for r in runs]))),
                "rl_share": round(float(np.mean([r.get("rl_share", 0.0) for r in runs])), 3),
                "phases": sum(len(r.get("phases", [])) for r in runs),
                "rolled_back": sum(p["rolled_back"] for r in runs for p in r.get("phases", [])),
                "ended_on": sorted({str(r.get("ended_on")) for r in runs}),
                "ended_on_rl": {str(s): r["calls"] for s, r in runs_of[arm].items() if r.get("ended_on") == "rl"},
            }
        diffs = {f"{a}_minus_{b}": interval(boot[a] - boot[b])
                 for a, b in (("adaptive", "fixed"), ("adaptive", "evolve"), ("fixed", "evolve"))}
        same = [s for s in seeds if runs_of["adaptive"][s].get("steps") == runs_of["fixed"][s].get("steps")]
        same_phases = [s for s in seeds if s not in same
                       and phase_generations(runs_of["adaptive"][s]) == phase_generations(runs_of["fixed"][s])]
        out["tasks"][task] = {"seeds": seeds, "test_inputs": {str(s): len(v["evolve"]) for s, v in per_seed.items()},
                              "rows": rows, "same_steps": same, "same_phases_only": same_phases, **diffs}
    better = [t for t, v in out["tasks"].items() if v["adaptive_minus_fixed"][0] > 0]
    worse = [t for t, v in out["tasks"].items() if v["adaptive_minus_fixed"][1] < 0]
    out["adaptive_better_on"], out["adaptive_worse_on"] = better, worse
    out["default_should_be"] = "adaptive" if better and not worse else "fixed"
    return out


def markdown(figures: dict[str, Any]) -> str:
    lines = ["| task | arm | test (mean of seeds) | 95% CI | per seed | completions | RL share | "
             "phases (rolled back) |", "|---|---|---|---|---|---|---|---|"]
    for task, t in figures["tasks"].items():
        for arm in ARMS:
            r = t["rows"][arm]
            seeds = ", ".join(f"{v:.3f}" for v in r["per_seed"].values())
            lines.append(f"| {task} | {arm} | {r['test']:.3f} | [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] | {seeds} "
                         f"| {r['calls']} | {r['rl_share']:.2f} | {r['phases']} ({r['rolled_back']}) |")
        for key in ("adaptive_minus_fixed", "adaptive_minus_evolve", "fixed_minus_evolve"):
            lo, hi = t[key]
            lines.append(f"| {task} | {key.replace('_minus_', ' - ')} | | [{lo:+.3f}, {hi:+.3f}] | | | | |")
    lines.append("")
    for task, t in figures["tasks"].items():
        if t["same_steps"]:
            lines.append(f"- {task}: adaptive and fixed took the same steps (searches, phases, completions) "
                         f"at seed(s) {', '.join(map(str, t['same_steps']))}, so their scores there are equal.")
        for seed in t.get("same_phases_only", []):
            adaptive, fixed = (t["rows"][arm]["per_seed"][str(seed)] for arm in ("adaptive", "fixed"))
            lines.append(f"- {task}: at seed {seed} adaptive and fixed trained after the same generations, yet "
                         f"their searches then went apart (test {adaptive:.3f} against {fixed:.3f}): one "
                         "schedule's choices, scored twice, differ by this much.")
        for arm in ARMS:
            for seed, calls in t["rows"][arm]["ended_on_rl"].items():
                lines.append(f"- {task} {arm} seed {seed} ended on an RL phase, {calls} completions spent against "
                             f"a budget of {figures['budget']}: the phase was priced below its cost.")
    lines.append("")
    lines.append(f"The cells ran at commit {figures['commit'][:10]} and "
                 f"{cells.describe_environments(figures['environments'])}.")
    lines.append(f"The default schedule should be "
                 f"`{figures['default_should_be']}` (adaptive better on {figures['adaptive_better_on'] or 'none'}, "
                 f"worse on {figures['adaptive_worse_on'] or 'none'}).")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {sorted(TASKS)} "
                    "or name=path/to/task.yaml")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--budget", type=int, default=BUDGET, help="completions per run")
    ap.add_argument("--results", type=Path, default=FOLDER, help="where the cells are kept")
    ap.add_argument("--plan", action="store_true", help="list done and missing cells, and stop")
    ap.add_argument("--summarize", action="store_true", help="write schedule.json/.md from the cells")
    ap.add_argument("--commit", help="the campaign's commit (default: the newest a done cell ran at)")
    ap.add_argument("--cell", nargs=3, metavar=("TASK", "ARM", "SEED"), help=argparse.SUPPRESS)
    cells.add_lane_args(ap)
    args = ap.parse_args()
    tasks = dict(TASKS)
    for item in args.tasks.split(","):
        name, _, path = item.partition("=")
        if path:
            tasks[name] = path
        elif name not in tasks:
            sys.exit(f"--tasks: unknown task {name!r}; known: {sorted(tasks)} (or name=path)")
    names = [i.partition("=")[0] for i in args.tasks.split(",")]
    grid = campaign(names, [int(s) for s in args.seeds.split(",")])
    if args.cell:
        task, arm, seed = args.cell
        start = time.perf_counter()
        result = run_cell(tasks[task], arm, int(seed), args.budget)
        command = "python bench/schedule.py " + " ".join(a for a in sys.argv[1:] if a != "--cell")
        print("wrote", cells.write(args.results, cells.Cell(task, arm, int(seed)), result, command,
                                   time.perf_counter() - start))
        return
    if args.plan or args.summarize:
        at = cells.summary_commit(args.commit, args.results, grid)
        if args.plan:
            print(cells.plan(args.results, grid, at, lambda c: GUESS_S[c.row]).describe())
        else:
            figures = summarize(args.results, grid, at)
            cells.write_summary(args.results.parent / "schedule.json", figures, args.results, grid, at,
                                Path(__file__))
            (args.results.parent / "schedule.md").write_text(markdown(figures))
            print(markdown(figures))
        return
    head, dirty = cells.commit()
    if dirty:
        sys.exit("evoagent/ or bench/ has uncommitted changes: a campaign runs at one commit "
                 "(run it from a git worktree of that commit)")
    todo = cells.plan(args.results, grid, head, lambda c: GUESS_S[c.row])
    print(todo.describe(), flush=True)
    argv = lambda c: [__file__, "--tasks", args.tasks, "--budget", str(args.budget),  # noqa: E731
                      "--results", str(args.results), "--cell", c.task, c.row, str(c.seed)]
    cells.run_missing(args.results, todo.missing, args, argv, f" (budget {args.budget} completions)")


if __name__ == "__main__":
    main()
