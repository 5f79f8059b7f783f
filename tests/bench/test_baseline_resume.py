"""bench/baselines.py under bench/headline.py: a GEPA or TRL cell killed partway goes on from
its saved state when the campaign runs it again, and counts the completions that state cost
(tiny random model: the plumbing, not the numbers)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "headline.py"
TASK = "examples/chained_ops/task.yaml"
sys.path.insert(0, str(ROOT / "bench"))

import baselines  # noqa: E402
import headline  # noqa: E402


class Killed(BaseException):
    """The process dying partway through a cell (not an error any layer may catch)."""


def baseline_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, row: str, budget: int) -> Path:
    """Point ``sys.argv`` at ``row``'s cell at ``budget`` under --quick, after running its seed
    cell; return where the campaign keeps that cell's unfinished run."""
    import cells

    monkeypatch.setattr(cells, "work_dir", lambda campaign, root=ROOT: tmp_path / "work" / campaign)
    monkeypatch.chdir(ROOT)
    quick = ["--task", TASK, "--out", str(tmp_path), "--quick", "--model", headline.tiny_model(tmp_path / "tiny")]
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--cell", "chained_ops", "seed", "0", *quick])
    headline.main()
    seed = json.loads((tmp_path / "headline" / "chained_ops" / "seed-s0.json").read_text())["best_graph"]
    (tmp_path / "seed.json").write_text(json.dumps(seed))
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--cell", "chained_ops", row, "0", *quick,
                                      "--seed-graph", str(tmp_path / "seed.json"), "--budget", str(budget)])
    return tmp_path / "work" / "headline"


def test_a_gepa_cell_killed_partway_resumes_its_saved_state_and_counts_what_it_spent(tmp_path, monkeypatch):
    pytest.importorskip("gepa")
    from evoagent.llm.backend import total_usage

    budget = 60
    work = baseline_cell(tmp_path, monkeypatch, "gepa", budget)
    reflect, prompts = baselines._Reflection.__call__, []

    def dies(self, prompt):  # the process dies in GEPA's fourth reflection
        prompts.append(prompt)
        if len(prompts) == 4:
            raise Killed
        return reflect(self, prompt)

    monkeypatch.setattr(baselines._Reflection, "__call__", dies)
    with pytest.raises(Killed):
        headline.main()
    [folder] = work.iterdir()
    spent = json.loads((folder / "progress.json").read_text())["calls"]
    assert (folder / "gepa" / "gepa_state.bin").is_file() and 0 < spent < budget

    monkeypatch.setattr(baselines._Reflection, "__call__", reflect)
    made, backends = baselines.make_backends, []

    def counted(*args):
        backends.extend(made(*args))
        return tuple(backends)

    monkeypatch.setattr(baselines, "make_backends", counted)
    headline.main()  # the campaign runs the cell again
    cell = json.loads((tmp_path / "headline" / "chained_ops" / "gepa-s0.json").read_text())
    assert cell["calls_before_resume"] == spent and cell["calls"] >= budget and not cell["capped"]
    assert total_usage(backends).calls < budget  # it went on: starting over spends the budget again
    assert not folder.exists()  # the cell is kept: its run folder is gone


def test_a_trl_cell_killed_partway_resumes_from_its_last_step(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    opts = argparse.Namespace(quick=True, policy="", operator_policy="", mutator="", schedule="", joint_budget=None,
                              run_seed=0, model=headline.tiny_model(tmp_path / "t0"))
    rl = headline.spec_for(TASK, "trl_grpo", str(tmp_path), None, opts).rl
    per_step = rl.inputs_per_step * rl.oversample * rl.group_size
    work = baseline_cell(tmp_path, monkeypatch, "trl_grpo", 4 * per_step)
    score, scored = baselines.score, []

    async def dies(*args, **kw):  # the process dies while the third step's completions are scored
        scored.append(args)
        if len(scored) > 2 * per_step:
            raise Killed
        return await score(*args, **kw)

    monkeypatch.setattr(baselines, "score", dies)
    with pytest.raises(Killed):
        headline.main()
    [folder] = work.iterdir()
    assert json.loads((folder / "progress.json").read_text())["calls"] == 2 * per_step

    scored.clear()
    monkeypatch.setattr(baselines, "score", lambda *args, **kw: scored.append(args) or score(*args, **kw))
    headline.main()  # the campaign runs the cell again
    cell = json.loads((tmp_path / "headline" / "chained_ops" / "trl_grpo-s0.json").read_text())
    assert cell["steps"] == cell["steps_planned"] == 4 and cell["calls"] == 4 * per_step
    assert cell["calls_before_resume"] == 2 * per_step
    assert len(scored) == 2 * per_step  # the third and fourth steps' completions only
    assert not folder.exists()
