"""bench/cells.py: a campaign kept cell by cell resumes with only its missing cells, marks a
cell from another commit and never summarizes it, and runs its chains in parallel lanes;
bench/schedule.py's summary on synthetic cells with a known answer."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import cells  # noqa: E402
import schedule  # noqa: E402


@pytest.fixture(autouse=True)
def clean_commit(monkeypatch):
    """Cells as a clean checkout at one commit writes them (this test may run in a dirty one)."""
    monkeypatch.setattr(cells, "commit", lambda root=ROOT: ("f" * 40, False))


def git_repo(repo: Path, *dates: str) -> tuple[Path, list[str]]:
    """A real repository with one empty commit per date, for code that asks git about commits."""
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    shas = []
    for when in dates:
        env = os.environ | {"GIT_COMMITTER_DATE": when, "GIT_AUTHOR_DATE": when}
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
                        "-m", when], cwd=repo, check=True, env=env)
        shas.append(subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                                   text=True, check=True).stdout.strip())
    return repo, shas


def finish(folder: Path, cell: cells.Cell, per_input: dict[str, float], wall: float = 60.0) -> None:
    cells.write(folder, cell, {"per_input": per_input, "calls": 100}, "python bench/x.py", wall)


def test_a_resumed_campaign_runs_only_its_missing_cells_and_marks_another_commits(tmp_path):
    grid = cells.grid(["gcd", "sums"], ["evolve", "fixed"], [0, 1])
    head, _ = cells.commit()
    for c in grid[:3]:
        finish(tmp_path, c, {"a": 1.0, "b": 1.0 if c.task == "sums" else 0.0}, wall=120.0)
    other = grid[3]
    finish(tmp_path, other, {"a": 0.0})
    data = json.loads(other.path(tmp_path).read_text()) | {"commit": "0" * 40}
    other.path(tmp_path).write_text(json.dumps(data))

    plan = cells.plan(tmp_path, grid, head, lambda c: 3600.0)
    assert plan.done == grid[:3] and plan.other == {other: "0" * 40}
    assert plan.missing == grid[3:]  # the other commit's cell runs again, with the never-run ones
    # hours left: a row with done cells costs their mean wall time, one without the guess
    guess = sum(120.0 if c.row in {d.row for d in plan.done} else 3600.0 for c in plan.missing)
    assert plan.hours_left == pytest.approx(guess / 3600)
    assert "other    sums/fixed-s0 (ran at 0000000000)" in plan.describe()
    # a done cell's mean test reward as it stands, for watching a campaign of many days
    assert "done     gcd/evolve-s0: 0.500" in plan.describe() and "done     sums/evolve-s0: 1.000" in plan.describe()
    with pytest.raises(SystemExit, match="cell sums/fixed-s0 ran at 0000000000, not at the campaign's commit"):
        cells.gather(tmp_path, grid[:4], head)
    with pytest.raises(SystemExit, match="cell gcd/evolve-s1 is missing"):
        cells.gather(tmp_path, cells.grid(["gcd"], ["evolve"], [0, 1]), head)
    assert set(cells.gather(tmp_path, grid[:3], head)) == set(grid[:3])


def test_a_run_left_half_done_is_resumed_only_by_the_commit_that_started_it(monkeypatch):
    here = cells.work_dir("schedule")
    monkeypatch.setattr(cells, "commit", lambda root=ROOT: ("0" * 40, False))
    there = cells.work_dir("schedule")
    assert here.parent == there.parent and here.name == "f" * 12 and there.name == "0" * 12


def test_a_summary_speaks_of_the_commit_given_else_the_campaigns_else_head(tmp_path):
    grid = cells.grid(["gcd"], ["evolve"], [0, 1, 2])
    assert cells.summary_commit(None, tmp_path, grid) == "f" * 40  # nothing ran yet: this checkout
    for c in grid:
        finish(tmp_path, c, {"a": 1.0})
    data = json.loads(grid[0].path(tmp_path).read_text()) | {"commit": "0" * 40}
    grid[0].path(tmp_path).write_text(json.dumps(data))
    assert cells.summary_commit(None, tmp_path, grid) == "f" * 40  # most cells ran there
    for c in grid[1:]:
        c.path(tmp_path).write_text(json.dumps(data))
    assert cells.summary_commit(None, tmp_path, grid) == "0" * 40  # the campaign's, not HEAD
    repo, (full,) = git_repo(tmp_path / "repo", "2026-12-01T00:00:00")
    assert cells.summary_commit(full[:7], tmp_path, grid, root=repo) == full  # as the cells record it
    with pytest.raises(SystemExit, match="--commit: 'abbeec4' names no commit in this repository"):
        cells.summary_commit("abbeec4", tmp_path, grid, root=repo)


def test_a_restarted_campaign_is_the_campaign_before_it_outnumbers_the_cells_left_from_before(tmp_path):
    repo, (old, new) = git_repo(tmp_path / "repo", "2026-12-01T00:00:00", "2026-12-02T00:00:00")
    grid = cells.grid(["gcd"], ["evolve"], [0, 1, 2])
    for c, sha in zip(grid, [old, old, new]):
        finish(tmp_path, c, {"a": 1.0})
        c.path(tmp_path).write_text(json.dumps(json.loads(c.path(tmp_path).read_text()) | {"commit": sha}))
    assert (campaign := cells.summary_commit(None, tmp_path, grid, root=repo)) == new
    plan = cells.plan(tmp_path, grid, campaign, lambda c: 60.0)
    assert plan.done == grid[2:] and set(plan.other) == set(grid[:2])


def test_a_cell_file_is_written_whole_with_its_commit(tmp_path):
    cell = cells.Cell("gcd", "adaptive", 2)
    finish(tmp_path, cell, {"q1": 1.0})
    data = json.loads((tmp_path / "gcd" / "adaptive-s2.json").read_text())
    assert data["commit"] == "f" * 40 and not data["dirty"] and data["cell"] == {"task": "gcd", "row": "adaptive", "seed": 2}
    assert data["command"] == "python bench/x.py" and data["per_input"] == {"q1": 1.0}
    assert not list(tmp_path.rglob("*.tmp"))
    # the cell's own time wins over a row's (a resumed row's run knows its last stretch only)
    cells.write(tmp_path, cell, {"per_input": {"q1": 1.0}, "wall_s": 5.0}, "python bench/x.py", 120.0)
    assert json.loads((tmp_path / "gcd" / "adaptive-s2.json").read_text())["wall_s"] == 120.0
    # what it ran on besides the commit: a fresh machine may install other releases
    env = data["environment"]
    assert env["torch"] == importlib.metadata.version("torch") and env["python"] == platform.python_version()
    assert env["cpu"] and env["threads"]


def test_a_killed_and_resumed_cell_counts_the_time_of_every_stretch(tmp_path):
    """A cell killed mid-run (no cleanup: a session's end, a kill -9) left its time so far in
    its run folder, and the resumed run's clock starts from it rather than from zero."""
    folder = tmp_path / "run"
    code = (f"import sys, time, os; sys.path.insert(0, {str(ROOT / 'bench')!r}); import cells\n"
            f"with cells.stopwatch(__import__('pathlib').Path({str(folder)!r}), every_s=0.05):\n"
            "    time.sleep(1.0); os._exit(9)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 9
    before = float((folder / "elapsed_s").read_text())
    assert before > 0
    with cells.stopwatch(folder) as elapsed:
        assert elapsed() >= before
    assert float((folder / "elapsed_s").read_text()) >= before  # saved on leaving, too


def test_a_summary_names_every_environment_its_cells_ran_in(tmp_path, monkeypatch):
    """Cells from two machines and one written before cells kept their environment: the
    summary counts each and says that one was not recorded."""
    grid = schedule.campaign(["gcd"], [0, 1, 2])
    for c in grid:
        finish(tmp_path, c, {"q1": 1.0})
    other = cells.Cell("gcd", "fixed", 1)
    old = cells.Cell("gcd", "evolve", 2)
    for c, env in ((other, cells.environment() | {"transformers": "0.0.1"}), (old, None)):
        data = json.loads(c.path(tmp_path).read_text())
        data.pop("environment")
        c.path(tmp_path).write_text(json.dumps(data | ({"environment": env} if env else {})))
    monkeypatch.setattr(cells, "drift", lambda since, root=ROOT: "")
    figures = schedule.summarize(tmp_path, grid, "f" * 40)
    assert [e["cells"] for e in figures["environments"]] == [7, 1, 1]
    assert figures["environments"][1]["environment"]["transformers"] == "0.0.1"
    assert figures["environments"][2]["environment"] == {}
    text = schedule.markdown(figures)
    assert "ran in 3 environments: 7 cell(s) in (python " in text and "1 cell(s) in (not recorded)" in text
    assert "transformers 0.0.1" in text


def test_the_schedule_summary_finds_a_known_difference(tmp_path, monkeypatch):
    """Adaptive right on every input, fixed on half, evolve on none: the CIs say so, and the
    default follows the rule (better on a task, worse on none)."""
    grid = schedule.campaign(["gcd"], [0, 1, 2])
    ids = [f"q{i}" for i in range(64)]
    for c in grid:
        score = {"adaptive": lambda i: 1.0, "fixed": lambda i: float(i % 2), "evolve": lambda i: 0.0}[c.row]
        finish(tmp_path, c, {q: score(i) for i, q in enumerate(ids)})
    monkeypatch.setattr(cells, "drift", lambda since, root=ROOT: "")
    figures = schedule.summarize(tmp_path, grid, "f" * 40)
    gcd = figures["tasks"]["gcd"]
    assert gcd["rows"]["adaptive"]["test"] == 1.0 and gcd["rows"]["fixed"]["test"] == 0.5
    lo, hi = gcd["adaptive_minus_fixed"]
    assert 0.3 < lo <= 0.5 <= hi < 0.7
    assert figures["default_should_be"] == "adaptive" and figures["adaptive_better_on"] == ["gcd"]
    assert "| gcd | adaptive - fixed | | [+" in schedule.markdown(figures)


def test_a_campaign_summary_stands_until_a_cell_changes_or_its_commit_leaves_history(tmp_path, monkeypatch):
    """What bench/stale.py checks of schedule.json, headline.json and split_screen.json."""
    head = cells._git(ROOT, "rev-parse", "HEAD")
    monkeypatch.setattr(cells, "commit", lambda root=ROOT: (head, False))
    grid = cells.grid(["gcd"], ["evolve", "fixed"], [0])
    for c in grid:
        finish(tmp_path / "schedule", c, {"a": 1.0})
    dest = cells.write_summary(tmp_path / "schedule.json", {"x": 1}, tmp_path / "schedule", grid, head,
                              ROOT / "bench" / "schedule.py")
    record = json.loads(dest.read_text())["campaign"]
    assert sorted(record["cells"]) == ["schedule/gcd/evolve-s0.json", "schedule/gcd/fixed-s0.json"]
    assert cells.campaign_problems(dest, record) == []
    assert all(p.startswith("bench/") for p in json.loads(dest.read_text())["code"])

    finish(tmp_path / "schedule", grid[1], {"a": 0.0})  # the cell was run again after the summary
    assert cells.campaign_problems(dest, record) == ["its cell schedule/gcd/fixed-s0.json changed since the summary"]
    gone = record | {"commit": "0" * 40}
    assert "its commit 0000000000 is not in HEAD's history" in cells.campaign_problems(dest, gone)


def test_a_landed_cell_is_committed_alone_and_other_staged_work_stays_staged(tmp_path, monkeypatch):
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "start")
    monkeypatch.setenv("GIT_AUTHOR_NAME", "t")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "t@t")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "t")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "t@t")
    (tmp_path / "work.py").write_text("x = 1\n")
    git("add", "work.py")  # someone's staged work
    monkeypatch.setenv(cells.LAND, "1")
    finish(tmp_path / "results", cells.Cell("gcd", "joint", 0), {"q": 1.0})
    assert git("log", "-1", "--name-only", "--format=%s").split() == [
        "results", "cell", "gcd/joint-s0", "(ran", "at", "ffffffffff)", "results/gcd/joint-s0.json"]
    assert git("diff", "--cached", "--name-only").split() == ["work.py"]


def test_a_cell_runs_in_its_own_process_and_one_that_fails_stops_the_campaign(tmp_path, capsys):
    script = tmp_path / "one_cell.py"
    script.write_text(
        "import json, sys\n"
        "folder, task, fail = sys.argv[1], sys.argv[2], sys.argv[3] == '1'\n"
        "if fail:\n    sys.exit(3)\n"
        "import pathlib; p = pathlib.Path(folder) / task / 'evolve-s0.json'\n"
        "p.parent.mkdir(parents=True); p.write_text(json.dumps({'calls': 7}))\n"
    )
    got = cells.spawn(tmp_path, cells.Cell("gcd", "evolve", 0), [str(script), str(tmp_path), "gcd", "0"], " (why)")
    assert got == {"calls": 7} and "== gcd/evolve-s0 (why)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        cells.spawn(tmp_path, cells.Cell("sums", "evolve", 0), [str(script), str(tmp_path), "sums", "1"])
    assert stop.value.code == 2 and "cell sums/evolve-s0 failed (exit 3)" in capsys.readouterr().err


def test_lanes_run_each_chain_in_one_process_share_the_cpus_and_summarize_once(tmp_path):
    (tmp_path / "one.py").write_text(
        "import json, os, pathlib, sys\n"
        "folder, task, row, seed = sys.argv[1:]\n"
        "p = pathlib.Path(folder) / task / f'{row}-s{seed}.json'\n"
        "p.parent.mkdir(parents=True, exist_ok=True)\n"
        "p.write_text(json.dumps({'lane': os.getppid(), 'threads': os.environ.get('OMP_NUM_THREADS')}))\n"
    )
    campaign = tmp_path / "campaign.py"
    campaign.write_text(
        "import argparse, pathlib, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
        "import cells\n"
        "ap = argparse.ArgumentParser(); ap.add_argument('folder'); cells.add_lane_args(ap)\n"
        "args = ap.parse_args(); folder = pathlib.Path(args.folder)\n"
        "grid = cells.grid(['gcd', 'sums'], ['evolve', 'joint'], [0, 1])\n"
        "missing = [c for c in grid if cells.read(folder, c) is None]\n"
        "one = pathlib.Path(__file__).with_name('one.py')\n"
        "argv = lambda c: [str(one), str(folder), c.task, c.row, str(c.seed)]\n"
        "if cells.run_missing(folder, missing, args, argv):\n"
        "    with open(folder / 'summaries', 'a') as f: f.write('one\\n')\n"
    )
    folder = tmp_path / "cells"
    folder.mkdir()
    done = cells.Cell("gcd", "evolve", 0)
    finish(folder, done, {"a": 1.0})
    subprocess.run([sys.executable, str(campaign), str(folder), "--lanes", "2"], check=True, timeout=120)

    grid = cells.grid(["gcd", "sums"], ["evolve", "joint"], [0, 1])
    kept = {c: cells.read(folder, c) for c in grid if c != done}
    assert all(kept.values()) and "lane" not in cells.read(folder, done)  # the done cell did not run again
    by_chain: dict[str, set[int]] = {}
    for c, d in kept.items():
        by_chain.setdefault(cells.chain(c), set()).add(d["lane"])
    assert all(len(pids) == 1 for pids in by_chain.values())  # a chain's cells ran in one lane, in order
    assert len({pid for pids in by_chain.values() for pid in pids}) == 2
    assert {d["threads"] for d in kept.values()} == {str(max(1, len(os.sched_getaffinity(0)) // 2))}
    assert (folder / "summaries").read_text() == "one\n"  # the campaign summarizes, its lanes do not


def test_chains_are_dealt_round_robin_and_a_lane_keeps_only_its_own():
    work = cells.grid(["gcd", "sums"], ["evolve", "joint"], [0, 1, 2])
    assert cells.deal(work, 4) == [["gcd:0", "gcd:2"], ["sums:0", "sums:2"], ["gcd:1"], ["sums:1"]]
    assert cells.deal(work[:2], 4) == [["gcd:0"]]  # no more lanes than chains
    assert cells.in_chains(work, "sums:1,gcd:2") == [
        cells.Cell("sums", "evolve", 1), cells.Cell("sums", "joint", 1),
        cells.Cell("gcd", "evolve", 2), cells.Cell("gcd", "joint", 2)]
    assert cells.in_chains(work, None) == work


def test_the_schedule_summary_says_where_the_arms_took_the_same_steps_and_where_a_run_ended_on_rl(
        tmp_path, monkeypatch):
    """At a budget where one phase fits, fixed and adaptive can choose alike: the summary says at
    which seeds, so equal scores read as a tie of choices, not of schedules, and where the same
    choices still scored apart (the spread a schedule difference must beat); a run that ended
    on an RL phase (priced below its cost) is named with what it spent."""
    grid = schedule.campaign(["gcd"], [0, 1, 2])
    alike = [{"generation": 1, "kind": "search", "requests": 259}, {"generation": 1, "kind": "rl", "requests": 900}]
    for c in grid:
        steps = alike if c.row != "evolve" and (c.seed in (0, 2) or c.row == "fixed") else alike[:1]
        if (c.row, c.seed) == ("adaptive", 2):  # the same phase, then a search that drew otherwise
            steps = alike + [{"generation": 2, "kind": "search", "requests": 300}]
        ended = "rl" if (c.row, c.seed) == ("fixed", 1) else "search"
        score = 0.0 if (c.row, c.seed) == ("adaptive", 2) else 1.0
        cells.write(tmp_path, c, {"per_input": {"q": score}, "calls": 3400 if ended == "rl" else 2100,
                                  "budget": 2000, "steps": steps, "ended_on": ended}, "python bench/x.py", 60.0)
    monkeypatch.setattr(cells, "drift", lambda since, root=ROOT: "")
    figures = schedule.summarize(tmp_path, grid, "f" * 40)
    assert figures["tasks"]["gcd"]["same_steps"] == [0]
    assert figures["tasks"]["gcd"]["same_phases_only"] == [2]
    assert figures["tasks"]["gcd"]["rows"]["fixed"]["ended_on_rl"] == {"1": 3400}
    text = schedule.markdown(figures)
    assert "gcd: adaptive and fixed took the same steps (searches, phases, completions) at seed(s) 0," in text
    assert ("gcd: at seed 2 adaptive and fixed trained after the same generations, yet their searches then "
            "went apart (test 0.000 against 1.000)") in text
    assert "gcd fixed seed 1 ended on an RL phase, 3400 completions spent against a budget of 2000" in text
