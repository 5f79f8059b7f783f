"""The whole product as a user meets it: ``evoagent run`` on the embedded SmolLM2, the archive
commands, refusing to clobber, ``--resume``; and a run killed with SIGKILL that resumes to the
same archive an uninterrupted run produces."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoagent.archive import Archive
from evoagent.cli import app
from evoagent.graph import load_graph, validate
from evoagent.tools import known_tools

ROOT = Path(__file__).resolve().parents[2]
SMALL = f"""
name: e2e
seed: 0
task:
  description: Arithmetic such as "Calculate 95 - 21."; the answer is one number.
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 40,
            options: {{min_terms: 2, max_terms: 2, min_digits: 2, max_digits: 2}}}}
  splits: {{train: 4, val: 6, test: 4}}
  tools: [calculator]
graphs: [{ROOT}/graphs/direct.yaml]
policy: {{max_batch: 16}}
evolve:
  generations: 2
  children: 2
  operators: [{{name: insert_tool, weight: 3}}, {{name: bootstrap_demos}}]
  cascade: {{minibatch: 3}}
rl: {{enabled: true, every: 1, steps: 1, group_size: 2, inputs_per_step: 2, lr: 1.0e-5}}
"""


@pytest.mark.slow
def test_run_inspect_and_resume_on_the_embedded_model(tmp_path):
    task = tmp_path / "task.yaml"
    task.write_text(SMALL)
    out = str(tmp_path / "pop")
    cli = CliRunner()
    res = cli.invoke(app, ["run", str(task), "--output", out])
    assert res.exit_code == 0, res.output
    assert "best agent" in res.output
    run_dir = Path(out) / "e2e"

    with Archive(run_dir, write=False) as a:
        assert a.last_generation() == (2, 1)  # a phase after gen 1 (v1), none after the last
        (ckpt,) = a.checkpoints()
        assert (run_dir / ckpt["path"]).is_file()
        best = a.best("val", 1)
        seed = next(r for r in a.agents() if r.operator == "seed")
        trajs = list(a.trajectories(seed.id, "val"))
        assert len(trajs) >= 6
        step = trajs[0].llm_steps[0]
        assert step.prompt_ids and len(step.completion_ids) == len(step.logprobs) > 0
        assert all(lp <= 0 for lp in step.logprobs)
        best_id = best[0].id
        assert a.score(best_id, "test", 1) is not None

    for args in (["list", str(run_dir)], ["show", str(run_dir), best_id],
                 ["lineage", str(run_dir), best_id], ["diff", str(run_dir), seed.id, best_id]):
        r = cli.invoke(app, ["archive", *args])
        assert r.exit_code == 0, r.output
        assert best_id[:8] in r.output or args[0] == "diff"
    exported = tmp_path / "best"
    assert cli.invoke(app, ["archive", "export", str(run_dir), best_id, str(exported)]).exit_code == 0
    validate(load_graph(exported / "graph.yaml"), known_tools())
    assert (exported / "adapter" / "adapter_config.json").is_file()  # weights v1: a LoRA adapter
    ran = subprocess.run([sys.executable, str(exported / "run.py"), "Calculate 12 + 30."],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr[-2000:]
    replayed = cli.invoke(app, ["archive", "replay", str(run_dir), best_id, "--input", "Calculate 12 + 30.",
                                "--json"])
    assert replayed.exit_code == 0, replayed.output
    steps = json.loads(replayed.stdout)["steps"]  # stdout is the JSON alone
    assert {s["weights_version"] for s in steps if s["kind"] == "llm"} == {1}
    assert (run_dir / "best.yaml").is_file() and (run_dir / "result.json").is_file()

    again = cli.invoke(app, ["run", str(task), "--output", out])
    assert again.exit_code == 2 and "--resume" in again.output
    resumed = cli.invoke(app, ["run", str(task), "--output", out, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert best_id in resumed.output


SCRIPTED = f"""
name: killed
seed: 1
task:
  description: arithmetic
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 60,
            options: {{min_terms: 2, max_terms: 2, min_digits: 2, max_digits: 2}}}}
  splits: {{train: 4, val: 8, test: 8}}
  reward: {{kind: python, ref: "slow_reward:score", extract: raw}}
  tools: [calculator]
graphs: [{ROOT}/graphs/direct.yaml, {ROOT}/graphs/critique_revise.yaml]
policy: {{kind: scripted}}
evolve:
  generations: 6
  children: 3
  operators: [{{name: insert_tool}}, {{name: add_node}}, {{name: remove_node}}, {{name: param_search}}]
  cascade: {{minibatch: 2}}
"""
SLOW_REWARD = """
import re, time
def score(answer, example):
    time.sleep(0.02)
    nums = re.findall(r"-?\\d+", answer)
    return float(bool(nums) and nums[-1] == example.answer)
"""


def evoagent(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "evoagent", "run", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigkill_then_resume_loses_nothing(tmp_path, snapshot):
    (tmp_path / "slow_reward.py").write_text(SLOW_REWARD)
    (tmp_path / "task.yaml").write_text(SCRIPTED)
    ref = evoagent(tmp_path, "task.yaml", "--output", "ref")
    assert ref.wait(timeout=300) == 0, ref.stdout.read()

    victim = evoagent(tmp_path, "task.yaml", "--output", "cut")
    db = tmp_path / "cut" / "killed" / "archive.sqlite"
    deadline = time.time() + 120
    while time.time() < deadline:
        if db.exists():
            try:
                with sqlite3.connect(db) as c:
                    if c.execute("SELECT count(*) FROM generations").fetchone()[0] >= 2:
                        break
            except sqlite3.OperationalError:
                pass
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL  # killed mid-run, not already finished
    with sqlite3.connect(db) as c:
        done = c.execute("SELECT max(generation) FROM generations").fetchone()[0]
    assert 1 <= done < 6, done
    resumed = evoagent(tmp_path, "task.yaml", "--output", "cut", "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stdout.read()
    assert f"resuming after generation {done}" in resumed.stdout.read()  # not started over
    assert snapshot(tmp_path / "cut" / "killed") == snapshot(tmp_path / "ref" / "killed")
