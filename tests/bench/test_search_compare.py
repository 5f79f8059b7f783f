"""bench/search_compare.py: every arm is the task's search with only its strategy changed (no
RL, the same budget and operators), and the figures it reports over seeds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import search_compare  # noqa: E402

from evoagent.check import check_spec  # noqa: E402


@pytest.mark.parametrize("arm", list(search_compare.ARMS))
def test_each_arm_changes_only_its_strategy(arm, tmp_path):
    spec = search_compare.spec_for(str(ROOT / "examples/equations/task.yaml"), arm, 2, 300, str(tmp_path))
    check_spec(spec)
    base = search_compare.spec_for(str(ROOT / "examples/equations/task.yaml"), "islands", 2, 300, str(tmp_path))
    assert spec.seed == 2 and not spec.rl.enabled and spec.evolve.max_calls == 300
    if "operators" in search_compare.ARMS[arm]:  # an operator-set arm: exactly its operators
        assert [o.name for o in spec.evolve.operators] == [o["name"] for o in search_compare.ARMS[arm]["operators"]]
    else:
        assert spec.evolve.operators == base.evolve.operators
        assert {"decompose", "best_of_n", "reflexion_retry"} <= {o.name for o in spec.evolve.operators}
    changed = {k for k in spec.evolve.model_fields if getattr(spec.evolve, k) != getattr(base.evolve, k)}
    assert changed == set(search_compare.ARMS[arm])


def test_the_summary_is_a_mean_with_a_t_interval_over_seeds():
    runs = [{"val": v, "test": t, "distinct_evaluated": 10, "calls": 480} for v, t in ((0.5, 0.4), (0.6, 0.5), (0.7, 0.6))]
    s = search_compare.summarize(runs)
    assert s["val"] == 0.6 and s["test"] == 0.5
    assert s["val_ci"] == pytest.approx([0.6 - 4.303 * 0.1 / 3**0.5, 0.6 + 4.303 * 0.1 / 3**0.5], abs=1e-4)


def test_the_drawing_shows_each_task_and_arm_with_its_interval(tmp_path, monkeypatch):
    monkeypatch.setattr(search_compare, "RESULTS", tmp_path)
    runs = [{"val": v, "test": v - 0.1, "distinct_evaluated": 10, "calls": 240} for v in (0.5, 0.6, 0.7)]
    arms = {"islands": search_compare.summarize(runs), "dgm": search_compare.summarize(runs[:1])}
    figures = {"budget": 240, "seeds": [0, 1, 2], "tasks": {"arithmetic": {"arms": arms}, "chained_ops": {"arms": arms}}}
    page = search_compare.draw(figures, "search_compare").read_text()
    assert "arithmetic" in page and "chained_ops" in page and "islands" in page and "dgm" in page
    assert "test of the best" in page and "distinct agents" in page
    assert "Plotly.newPlot" in page and 'src="http' not in page  # plotly.js embedded: opens offline


def test_with_match_budget_the_later_arms_get_what_the_first_spent_per_seed(monkeypatch):
    """A costly operator overshoots the budget by a generation's worth of completions; the arms
    it is compared with then search until they have spent as much."""
    import argparse

    asked = []

    def fake_spawn(task, arm, seed, budget, val, name):
        asked.append((arm, seed, budget))
        spent = budget + 400 + seed if arm == "instruction_demo_search" else budget + 8
        return {"val": 0.5, "test": 0.5, "distinct_evaluated": 4, "calls": spent}

    monkeypatch.setattr(search_compare, "spawn", fake_spawn)
    args = argparse.Namespace(budget=600, val=16, name="x", match_budget=True)
    arms = search_compare.run_arms("t.yaml", ["instruction_demo_search", "prompt_ops"], [0, 1], args)
    assert asked[2:] == [("prompt_ops", 0, 1000), ("prompt_ops", 1, 1001)]
    assert arms["instruction_demo_search"]["budgets"] == [600, 600] and arms["prompt_ops"]["budgets"] == [1000, 1001]
    asked.clear()
    search_compare.run_arms("t.yaml", ["instruction_demo_search", "prompt_ops"], [0], argparse.Namespace(
        budget=600, val=16, name="x", match_budget=False))
    assert asked == [("instruction_demo_search", 0, 600), ("prompt_ops", 0, 600)]
