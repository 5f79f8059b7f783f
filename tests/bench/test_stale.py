"""bench/stale.py: a result whose code changed since it was written fails the check, unless
bench/stale_ok.json names that exact change; the code a script ran is what it can reach."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import code_graph  # noqa: E402
import stale  # noqa: E402

NOW = code_graph.digest((ROOT / "evoagent" / "errors.py").read_bytes())
RL_GAIN = code_graph.manifest(ROOT / "bench" / "rl_gain.py")  # rl_gain.json's code as it stands
HEADLINE = code_graph.manifest(ROOT / "bench" / "headline.py")


@pytest.fixture
def results(tmp_path, monkeypatch):
    """``results(name, data)`` writes a results file (stale_ok.json is ``tmp_path``'s)."""
    monkeypatch.setattr(stale, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(stale, "OK_FILE", tmp_path / "stale_ok.json")
    (tmp_path / "results").mkdir()

    def write(name: str, data: dict) -> None:
        (tmp_path / "results" / name).write_text(json.dumps(data))

    return write


def test_a_result_of_the_code_as_it_stands_passes(results):
    assert RL_GAIN["evoagent/errors.py"] == NOW
    results("rl_gain.json", {"x": 1, "code": RL_GAIN})
    assert stale.check() == []


def test_a_module_the_script_reaches_now_but_did_not_record_is_a_change(results):
    """Code split out of a module a result ran into a new one changes what it runs."""
    results("rl_gain.json", {"code": {p: h for p, h in RL_GAIN.items() if p != "evoagent/errors.py"}})
    (problem,) = stale.check()
    assert problem.startswith("rl_gain.json: its code changed") and "evoagent/errors.py" in problem


def test_changed_code_is_flagged_until_stale_ok_names_that_exact_change(results, tmp_path):
    results("rl_gain.json", {"code": RL_GAIN | {"evoagent/errors.py": "0" * 16, "bench/gone.py": "1" * 16}})
    (problem,) = stale.check()
    assert problem.startswith("rl_gain.json: its code changed") and "evoagent/errors.py" in problem
    assert "bench/gone.py" in problem
    ok = {"rl_gain.json": {"files": {"evoagent/errors.py": NOW, "bench/gone.py": None}, "why": "docstring only"}}
    (tmp_path / "stale_ok.json").write_text(json.dumps(ok))
    assert stale.check() == []
    ok["rl_gain.json"]["files"]["evoagent/errors.py"] = "2" * 16  # excuses another version of the file
    (tmp_path / "stale_ok.json").write_text(json.dumps(ok))
    assert "evoagent/errors.py" in stale.check()[0]


def test_each_task_of_the_headline_is_checked_against_its_own_code(results):
    results("headline.json", {"tasks": {"sums": {"code": HEADLINE},
                                        "products": {"code": HEADLINE | {"evoagent/errors.py": "0" * 16}},
                                        "older": {"rows": {}}}})
    assert [p.split(":")[0] for p in stale.check()] == ["headline.json#products", "headline.json#older"]


def test_a_script_runs_what_it_imports_lazily_and_its_inputs():
    code = code_graph.manifest(ROOT / "bench" / "headline.py", (ROOT / "examples" / "sums",))
    assert {"bench/headline.py", "bench/baselines.py", "evoagent/llm/hf.py", "evoagent/evolve/prompt_ops.py",
            "examples/sums/task.yaml"} <= set(code)
    assert {"evoagent/__init__.py", "evoagent/tasks/__init__.py"} <= set(code)  # packages run first
    assert "bench/rl_gain.py" not in code and "evoagent/report.py" not in code


def test_rl_gain_keeps_other_arms_only_from_a_file_this_code_wrote(tmp_path, monkeypatch):
    """``rl_gain.py --arms chain_sum`` keeps the other arms' figures from the last file, and that
    file records one code for every arm: kept figures from other code would pass as this code's."""
    import rl_gain

    monkeypatch.setattr(rl_gain, "RESULTS", tmp_path)
    arm = {"kind": "frozenlake", "algorithm": "grpo"}
    (tmp_path / "rl_gain.json").write_text(json.dumps({"arms": [arm], "code": {"bench/rl_gain.py": "old"}}))
    monkeypatch.setattr(rl_gain, "run_arm", lambda *a: pytest.fail("ran an arm before refusing"))
    with pytest.raises(SystemExit, match="other code wrote"):
        rl_gain.main(16, 6, ["chain_sum"])
