"""bench/split_screen.py's overlap figures on synthetic per-input outcomes with a known answer,
and every candidate's task as it writes it passes the spec check (the splits fit its data)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import cells  # noqa: E402
import split_screen  # noqa: E402


def test_fixes_overlap_and_what_joint_could_add():
    ids = [f"q{i}" for i in range(10)]
    seed = {i: 1.0 if i in ("q0", "q1") else 0.0 for i in ids}
    evolve = {i: 1.0 if i in ("q0", "q2", "q3", "q4") else 0.0 for i in ids}  # fixes q2-q4, breaks q1
    rl = {i: 1.0 if i in ("q0", "q1", "q4", "q5") else 0.0 for i in ids}  # fixes q4, q5
    key = "gcd-L0"
    got = {cells.Cell(key, row, split_screen.SEED): {"per_input": v, "calls": 10}
           for row, v in (("seed", seed), ("evolve", evolve), ("rl", rl))}
    figures = split_screen.summarize(got, {"gcd": key}) | {
        "commit": "f" * 40, "probes": {"gcd-L0": 0.2, "leg_counting-L0": 0.0}}
    t = figures["tasks"]["gcd"]
    assert (t["seed"], t["evolve"], t["rl"]) == (0.2, 0.4, 0.4)
    assert (t["evolve_fixes"], t["rl_fixes"], t["both_fix"]) == (3, 2, 1)
    assert t["union_minus_max"] == 1 and t["union_minus_max_share"] == 0.1  # {q2..q5} minus 3
    table = split_screen.markdown(figures)
    assert figures["chosen"] == ["gcd"] and "| gcd | 0 | 0.200 | 0.400 | 0.400 | 3 | 2 | 1 | 1 |" in table
    assert "Left out (the seed outside 0.05-0.5 at every level tried): leg_counting-L0 0.000." in table
    assert "Chosen for the headline: gcd;" in table


@pytest.mark.parametrize("candidate", sorted(split_screen.CANDIDATES))
def test_every_candidate_level_is_a_valid_task(candidate, tmp_path):
    from evoagent.check import check_spec
    from evoagent.spec import load_spec

    assert len(split_screen.CANDIDATES) >= 8
    for level in range(len(split_screen.CANDIDATES[candidate][2])):
        for row in ("seed", "evolve", "rl"):
            spec = load_spec(split_screen.write_task(candidate, level, row, tmp_path / f"{level}{row}"))
            check_spec(spec)
            assert spec.task.splits.test == split_screen.SCREEN and spec.seed == split_screen.SEED
            assert (spec.evolve.children == 0) == (row == "rl") and spec.rl.enabled == (row == "rl")


def test_the_screened_questions_are_the_screens_test_split(tmp_path):
    """What a headline task excludes is exactly what the screen scored (128 questions)."""
    questions = split_screen.screened("gcd-L0", tmp_path)
    assert len(questions) == split_screen.SCREEN == len(set(questions))
    assert all(q.startswith("Find the Greatest Common Divisor") for q in questions)
    assert questions == split_screen.screened("gcd-L0", tmp_path / "again")


@pytest.mark.parametrize(("example", "key"), [("basic_arithmetic", "basic_arithmetic-L0"),
                                              ("products_2x1", "products-L0"), ("chain_sum3", "chain_sum3-L0")])
def test_a_headline_task_excludes_what_the_screen_wrote(example, key):
    """The exclusion file a headline task carries is what ``--screened`` prints for its
    screened level: the screen's questions, which its test split must not hold."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "split_screen.py"), "--screened", key],
                         capture_output=True, text=True, check=True, env=os.environ | {"HF_HUB_OFFLINE": "1"}).stdout
    assert out == (ROOT / "examples" / example / "screened.jsonl").read_text()
