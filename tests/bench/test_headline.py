"""bench/headline.py: the six rows wired end to end on a tiny random model (the numbers are
meaningless there, the plumbing is not), the paired bootstrap, and its refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "headline.py"
TASK = "examples/chained_ops/task.yaml"
sys.path.insert(0, str(ROOT / "bench"))

import headline  # noqa: E402


def run(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"{prelude}import runpy, sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); sys.argv = {[str(SCRIPT), *args]!r}; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=900)


@pytest.mark.slow
def test_quick_runs_all_six_rows_at_the_joint_rows_budget_and_resumes_only_missing_cells(tmp_path):
    pytest.importorskip("gepa")
    pytest.importorskip("trl")
    proc = run("--quick", "--seeds", "0,1", "--tasks", TASK, "--out", str(tmp_path), "--lanes", "2")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "== lane 0: chained_ops:0" in proc.stdout and "== lane 1: chained_ops:1" in proc.stdout
    figures = json.loads((tmp_path / "headline.json").read_text())
    task = figures["tasks"]["chained_ops"]
    assert set(task["rows"]) == set(headline.ROWS) and task["seeds"] == [0, 1]
    for name, row in task["rows"].items():
        assert 0.0 <= row["ci"][0] <= row["test"] <= row["ci"][1] <= 1.0
        assert row["calls"] > 0 and row["tokens"] > 0 and row["wall_s"] >= 0
        assert set(row["per_seed"]) == {"0", "1"}
        for seed in ("0", "1"):  # each seed's rows search until that seed's joint row's budget is spent
            if name in ("gepa", "evolve", "rl"):
                budget = task["details"]["joint"][seed]["calls"]
                assert task["details"][name][seed]["calls"] >= budget
    assert task["test_inputs"] == {"0": 4, "1": 4} and len(task["joint_minus_best_other"]) == 2
    # every seed is tested on the same inputs (task.splits.test_seed), with its own train and val
    per_input = {s: set(json.loads((tmp_path / "headline" / "chained_ops" / f"seed-s{s}.json").read_text())["per_input"])
                 for s in (0, 1)}
    assert per_input[0] == per_input[1]
    assert task["command"].startswith("python bench/headline.py --quick") and task["capped"] == []
    assert figures["quick"] is True
    [env] = task["environments"]  # every cell says what it ran on, and here all ran alike
    assert env["cells"] == 12 and env["environment"]["gepa"] != "not installed"
    table = (tmp_path / "headline.md").read_text()
    assert table.count("| chained_ops |") == 7 and "--quick" in table
    assert f"Every cell ran at commit {figures['commit'][:10]}" in table
    assert f"its cells ran in one environment: python {env['environment']['python']}, torch" in table
    record = figures["campaign"]
    assert len(record["cells"]) == 12 and record["commit"] == figures["commit"]

    import cells

    assert cells.campaign_problems(tmp_path / "headline.json", record) == []
    # a killed campaign: one cell lost, one from another commit; the next run redoes just those
    (tmp_path / "headline" / "chained_ops" / "evolve-s1.json").unlink()
    moved = tmp_path / "headline" / "chained_ops" / "rl-s0.json"
    moved.write_text(json.dumps(json.loads(moved.read_text()) | {"commit": "0" * 40}))
    problems = cells.campaign_problems(tmp_path / "headline.json", record)
    assert "its cell headline/chained_ops/evolve-s1.json is gone" in problems
    assert "its cell headline/chained_ops/rl-s0.json changed since the summary" in problems
    plan = run("--quick", "--seeds", "0,1", "--tasks", TASK, "--out", str(tmp_path), "--plan")
    assert "10 done, 2 missing, 1 from another commit" in plan.stdout
    assert "other    chained_ops/rl-s0 (ran at 0000000000)" in plan.stdout
    again = run("--quick", "--seeds", "0,1", "--tasks", TASK, "--out", str(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:] + again.stdout[-3000:]
    ran = [ln[3:] for ln in again.stdout.splitlines() if ln.startswith("== ")]
    assert ran == ["chained_ops/rl-s0", "chained_ops/evolve-s1"]
    assert cells.campaign_problems(tmp_path / "headline.json", json.loads((tmp_path / "headline.json").read_text())["campaign"]) == []


def test_an_unknown_row_or_a_missing_package_is_refused_before_anything_runs(tmp_path):
    proc = run("--rows", "seed,bogus", "--out", str(tmp_path))
    assert proc.returncode == 2 and "--rows: unknown row(s) ['bogus']" in proc.stderr
    proc = run("--rows", "seed,gepa,joint", "--out", str(tmp_path), prelude="import sys; sys.modules['gepa'] = None; ")
    assert proc.returncode == 2
    assert "the gepa row needs the gepa package" in proc.stderr and "evoagent-ml[bench]" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_task_whose_seeds_all_score_zero_is_refused_and_nothing_is_summarized(tmp_path):
    proc = run("--quick", "--require-signal", "--rows", "seed", "--tasks", TASK, "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "every seed agent scores 0 on val" in proc.stderr and "no learning signal" in proc.stderr
    assert not (tmp_path / "headline.json").exists()


def _row(rewards: list[float]) -> dict:
    return {"per_input": {f"i{k}": r for k, r in enumerate(rewards)}, "calls": 1, "tokens": 1, "wall_s": 0.0}


def _one_seed(**rows: list[float]) -> dict:
    return {name: {0: _row(r)} for name, r in rows.items()}


def test_paired_bootstrap_sees_a_consistent_gain_that_unpaired_scores_would_blur():
    rng = np.random.default_rng(1)
    hard = rng.random(64) < 0.5  # inputs every row finds hard
    base = [float(not h and rng.random() < 0.8) for h in hard]
    joint = [max(b, float(not h)) for b, h in zip(base, hard)]  # never worse, better on some
    out = headline.summarize(_one_seed(seed=base, joint=joint))
    assert out["best_other"] == "seed"
    lo, hi = out["joint_minus_best_other"]
    assert 0 < lo <= hi
    same = headline.summarize(_one_seed(seed=base, joint=base))
    assert same["joint_minus_best_other"] == [0.0, 0.0]


def test_a_gain_in_one_seed_only_is_not_claimed_but_one_in_every_seed_is():
    """The CI draws seeds as well as inputs: a row that wins big under one run seed and loses
    under the others is not clear of 0, however many inputs each seed has."""
    rng = np.random.default_rng(2)
    base = {s: [float(x) for x in rng.random(64) < 0.5] for s in range(3)}

    def lifted(seed: int, by: float) -> list[float]:
        return [1.0 if (b == 0.0 and rng.random() < by) else b for b in base[seed]]

    def rows(joint: dict[int, list[float]]) -> dict:
        return {"seed": {s: _row(base[s]) for s in base}, "joint": {s: _row(joint[s]) for s in base}}

    everywhere = headline.summarize(rows({s: lifted(s, 0.4) for s in base}))
    assert everywhere["joint_minus_best_other"][0] > 0
    assert set(everywhere["joint_minus_best_other_per_seed"]) == {"0", "1", "2"}
    worse = [[0.0 if (b == 1.0 and rng.random() < 0.3) else b for b in base[s]] for s in (1, 2)]
    once = headline.summarize(rows({0: lifted(0, 0.9), 1: worse[0], 2: worse[1]}))
    assert once["rows"]["joint"]["test"] > once["rows"]["seed"]["test"]
    lo, hi = once["joint_minus_best_other"]
    assert lo < 0 < hi


def test_rows_tested_on_different_inputs_are_refused():
    with pytest.raises(SystemExit, match="other inputs"):
        headline.summarize(_one_seed(seed=[1.0, 0.0], joint=[1.0, 0.0, 1.0]))


def test_the_bootstrap_of_a_known_paired_difference_is_that_difference():
    """Joint scores exactly 0.25 above the seed row on every input of every seed (partial
    credit), while the seeds' levels differ: every resample of seeds and inputs gives 0.25."""
    rows = {"seed": {}, "joint": {}}
    for s, level in enumerate((0.2, 0.4, 0.6)):
        rows["seed"][s] = _row([level] * 50)
        rows["joint"][s] = _row([level + 0.25] * 50)
    out = headline.summarize(rows)
    assert out["joint_minus_best_other"] == [0.25, 0.25]
    assert out["rows"]["seed"]["test"] == pytest.approx(0.4)
    lo, hi = out["rows"]["seed"]["ci"]
    assert 0.2 <= lo < 0.4 < hi <= 0.6  # the spread across seeds is in the row's own interval


def test_the_joint_row_is_required_by_the_budgeted_rows(tmp_path):
    proc = run("--rows", "seed,evolve", "--out", str(tmp_path))
    assert proc.returncode == 2 and "the budgeted rows need the joint row" in proc.stderr


def test_a_cell_from_other_settings_or_another_budget_is_not_this_campaigns(tmp_path):
    import argparse

    import cells

    args = argparse.Namespace(mutator="embedded", policy="", operator_policy="", schedule="adaptive", joint_budget=0,
                              trl_minutes=600.0, gepa_minutes=600.0, quick=False, cells=tmp_path)

    def keep(row: str, **extra) -> dict:
        data = {"settings": headline.settings(args, row), "calls": 100, "budget": None, **extra}
        (tmp_path / "gcd").mkdir(exist_ok=True)
        (tmp_path / "gcd" / f"{row}-s0.json").write_text(json.dumps(data))
        return data

    joint = keep("joint", calls=3200)
    assert headline.mismatch(cells.Cell("gcd", "joint", 0), joint, args) is None
    evolve = keep("evolve", budget=3200)
    assert headline.mismatch(cells.Cell("gcd", "evolve", 0), evolve, args) is None
    assert "not what its joint row spent" in headline.mismatch(cells.Cell("gcd", "evolve", 0), evolve | {"budget": 900}, args)
    other = argparse.Namespace(**{**vars(args), "schedule": "fixed"})
    assert "ran with other settings" in headline.mismatch(cells.Cell("gcd", "joint", 0), joint, other)
    assert headline.mismatch(cells.Cell("gcd", "evolve", 0), evolve, other) is None  # evolve has no schedule
    longer = argparse.Namespace(**{**vars(args), "joint_budget": 2000})
    assert "ran with other settings" in headline.mismatch(cells.Cell("gcd", "joint", 0), joint, longer)
    assert headline.mismatch(cells.Cell("gcd", "evolve", 0), evolve, longer) is None  # its budget: joint's spend


def test_the_joint_budget_unbounds_the_generations_and_stops_joint_at_that_spend(tmp_path):
    import argparse

    opts = argparse.Namespace(quick=False, run_seed=1, policy="", operator_policy="", mutator="", model=None,
                              schedule="adaptive", joint_budget=2000)
    task = str(ROOT / "examples/sums/task.yaml")
    spec = headline.spec_for(task, "joint", str(tmp_path), None, opts)
    assert spec.evolve.max_calls == 2000 and spec.evolve.generations == headline.SEARCHES
    assert spec.rl.enabled and spec.rl.schedule == "adaptive"
    as_written = headline.spec_for(task, "joint", str(tmp_path), None, argparse.Namespace(**{**vars(opts), "joint_budget": 0}))
    assert as_written.evolve.max_calls is None and as_written.evolve.generations < headline.SEARCHES


def test_the_summary_says_which_inputs_each_half_fixed_and_whether_joint_added_them_up():
    ids = [f"q{i}" for i in range(6)]
    row = lambda right: {"per_input": {i: float(i in right) for i in ids}, "calls": 1, "tokens": 1, "wall_s": 1}  # noqa: E731
    rows = {"seed": {0: row({"q0", "q1"})}, "evolve": {0: row({"q0", "q1", "q2", "q3"})},
            "rl": {0: row({"q0", "q1", "q3", "q4"})}, "joint": {0: row({"q0", "q2", "q4", "q5"})}}
    step = lambda kind, requests: {"kind": kind, "requests": requests}  # noqa: E731
    rows["rl"][0]["steps"] = [step("search", 0), step("rl", 8), step("search", 0), step("rl", 8)]
    rows["joint"][0]["steps"] = [step("search", 10), step("rl", 20), step("search", 5)]
    f = headline.summarize(rows)["fixes"]
    # evolve fixes q2, q3; RL q3, q4; joint fixes q2 and q4 of that union, q5 besides, and breaks q1
    assert f == {"evolve": 2, "rl": 2, "both": 1, "union_minus_max": 1, "joint_of_union": 2,
                 "joint_other": 1, "joint_broke": 1}
    figures = {"tasks": {"t": headline.summarize(rows) | {"command": "c", "seeds": [0], "mutator": "m",
               "schedule": "fixed", "joint_ended_on": ["search"], "policy": "p", "operator_policy": "o",
               "joint_rl": {"0": {"phases": 0, "rl_share": 0.0}, "1": {"phases": 1, "rl_share": 0.51}},
               "capped": [], "environments": [{"environment": {}, "cells": 4}]}}, "commit": "f" * 40, "evoagent_changed_since": ""}
    text = headline.markdown(figures)
    assert "evolve-only fixed 2, RL-only 2, both 1 (union - max: 1); joint fixed 2 of that union and 1 others, " \
           "and broke 1" in text
    # under a budget joint may skip RL at a seed: the summary says so, seed by seed
    assert "its RL phases by seed: 0: 0 (0% of its completions), 1: 1 (51% of its completions))" in text
    # what each row spent its completions on: joint two search generations around one RL phase,
    # RL-only's children-free generations not counted; the seed row has no steps at all
    assert "| t | joint | 0.667 | " in text and "| 1 | 2 / 1 | 1 | 0.0 |" in text
    assert "| 1 | 0 / 2 | 1 | 0.0 |" in text and "| 1 | - | 1 | 0.0 |" in text


def test_a_cell_killed_after_its_search_resumes_its_archive_and_spends_nothing_again(tmp_path, monkeypatch, capsys):
    import cells

    monkeypatch.setattr(cells, "work_dir", lambda campaign, root=ROOT: tmp_path / "work" / campaign)
    monkeypatch.chdir(ROOT)
    tiny = headline.tiny_model(tmp_path / "tiny")
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--cell", "chained_ops", "joint", "0", "--task", TASK,
                                      "--out", str(tmp_path), "--quick", "--model", tiny])
    write, kept = cells.write, []

    def killed(folder, cell, result, *rest):  # the process dies before its cell file is written
        kept.append(result)
        raise KeyboardInterrupt

    monkeypatch.setattr(cells, "write", killed)
    with pytest.raises(KeyboardInterrupt):
        headline.main()
    [folder] = (tmp_path / "work" / "headline").iterdir()
    assert folder.name.startswith("chained_ops-joint-s0-") and any(folder.rglob("archive.sqlite"))
    capsys.readouterr()

    monkeypatch.setattr(cells, "write", write)
    headline.main()  # the campaign runs the cell again
    assert "resuming after generation" in capsys.readouterr().out
    cell = json.loads((tmp_path / "headline" / "chained_ops" / "joint-s0.json").read_text())
    assert cell["calls"] == kept[0]["calls"] and cell["per_input"] == kept[0]["per_input"]
    assert not folder.exists()  # kept: its run folder is gone


def test_a_task_whose_test_draw_cannot_hold_its_splits_is_refused_before_any_cell_runs(tmp_path, monkeypatch, capsys):
    import argparse

    sums = "examples/sums/task.yaml"
    monkeypatch.chdir(ROOT)
    opts = argparse.Namespace(policy="", operator_policy="", mutator="", model=None, schedule="", joint_budget=2000, quick=False)
    for seed in (0, 1, 2):  # the control task, as the campaign runs it
        spec = headline.spec_for(sums, "joint", str(tmp_path), None, argparse.Namespace(**vars(opts), run_seed=seed))
        assert spec.task.splits.test_seed == headline.TEST_SEED
    monkeypatch.setattr(headline, "TEST_SEED", 1000)  # sums' 400 draws hold 169 distinct questions there
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--tasks", sums, "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        headline.main()
    err = capsys.readouterr().err
    assert "sums/task.yaml at run seed 0, as the headline runs it: task.splits:" in err and "169 distinct" in err
    assert not (tmp_path / "headline").exists()


def test_a_cell_another_process_finished_meanwhile_is_not_run_again(tmp_path, monkeypatch):
    import argparse

    import cells

    args = argparse.Namespace(cells=tmp_path, quick=False, require_signal=False, mutator="m", policy="",
                              operator_policy="", schedule="fixed", joint_budget=100, trl_minutes=1.0,
                              gepa_minutes=1.0)
    grid = [cells.Cell("t", "seed", 0), cells.Cell("t", "joint", 0), cells.Cell("t", "evolve", 0)]
    ran = []

    def run_cell(task, cell, opts, work):
        ran.append(cell)
        for c in [cell] + ([grid[1]] if cell.row == "seed" else []):  # meanwhile, another process ran joint
            cells.write(tmp_path, c, {"val": 0.5, "calls": 100, "budget": 100 if c.row == "evolve" else None,
                                      "settings": headline.settings(opts, c.row), "per_input": {}}, "x", 1.0)
        return cells.read(tmp_path, cell)

    monkeypatch.setattr(headline, "run_cell", run_cell)
    headline.run_chains(args, {"t": "t.yaml"}, grid, cells.commit()[0])
    assert ran == [grid[0], grid[2]]
