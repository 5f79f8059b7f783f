"""DPO and RFT through ``evoagent run``: each phase's rollouts are archived (split train) and a
later phase reads them back (as pairs, or successes); other algorithms leave the train split
empty."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoagent.archive import Archive
from evoagent.cli import app

ROOT = Path(__file__).resolve().parents[2]
SPEC = """
name: pairs
seed: 1
task:
  description: Arithmetic such as "Calculate 5 + 3."; the answer is one number.
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 20,
            options: {{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}}}
  splits: {{train: 2, val: 2, test: 0}}
  reward: {{kind: python, ref: "parity_reward:score", extract: raw}}
graphs: [{root}/graphs/direct.yaml]
policy: {{kind: hf, model: {model}, dtype: float32, max_batch: 16}}
evolve: {{generations: 3, children: 1, operators: [{{name: param_search}}], cascade: {{minibatch: 2}}}}
rl: {{enabled: true, every: 1, steps: 1, group_size: 4, inputs_per_step: 2, lr: 1.0e-3,
      max_completion_tokens: 8, algorithm: {algorithm}}}
"""
PARITY = "def score(answer, example):\n    return float(len(answer) % 2)\n"


@pytest.mark.parametrize("algorithm", ["dpo", "rft", "grpo"])
def test_dpo_rollouts_are_archived_and_read_back(tmp_path, tiny_model_dir, algorithm, monkeypatch):
    (tmp_path / "parity_reward.py").write_text(PARITY)
    task = tmp_path / "task.yaml"
    task.write_text(SPEC.format(root=ROOT, model=tiny_model_dir, algorithm=algorithm))
    read = Archive.trajectories_of_inputs
    during: list[int] = []  # what each phase's read of the archive gave, during the run
    monkeypatch.setattr(Archive, "trajectories_of_inputs",
                        lambda self, *a: during.append(len(out := read(self, *a))) or out)
    res = CliRunner().invoke(app, ["run", str(task), "--output", str(tmp_path / "pop"),
                                   "--progress", "quiet"])
    assert res.exit_code == 0, res.output
    # dpo and rft read the archive in each phase: nothing before the first, the first phase's
    # 2 inputs x 4 samples in the second; grpo never reads it
    assert during == ([] if algorithm == "grpo" else [0, 8]), during
    with Archive(tmp_path / "pop" / "pairs", write=False) as a:
        assert [r["weights_version"] for r in a.checkpoints()] == [1, 2]
        inputs = sorted({row["input_id"] for row in a.db.execute(
            "SELECT input_id FROM trajectories WHERE split='train'")})
        older = a.trajectories_of_inputs("train", inputs)
    if algorithm == "grpo":
        assert older == []
        return
    # two phases x 2 inputs x 4 samples, each phase tagged with the version it started from
    assert len(older) == 16 and {t.llm_steps[0].weights_version for t in older} == {0, 1}
