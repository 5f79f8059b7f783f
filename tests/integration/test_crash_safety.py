"""kill -9 at any moment loses nothing: a run on a real (tiny, random) hf policy with RL phases
is SIGKILLed in every phase — seeding, mutation, evaluation, RL rollouts, right after a
checkpoint write, the final test — and resumed each time; it ends with the archive an
uninterrupted run with the same seed produces, and the database passes its integrity check.
Ctrl-C stops a run cleanly, says how to resume, and a second writer is refused; kill -USR1
prints where a run is without stopping it."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

SPEC = """
name: crash
seed: 5
task:
  description: Arithmetic such as "Calculate 95 - 21."; the answer is one number.
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 40,
            options: {{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2}}}}
  splits: {{train: 4, val: 6, test: 4}}
  reward: {{kind: python, ref: "slow_reward:score"}}
  tools: [calculator]
graphs: [{root}/graphs/direct.yaml, {root}/graphs/cot.yaml]
policy: {{kind: hf, model: {model}, dtype: float32, max_batch: 16}}
evolve:
  generations: 3
  children: 2
  operators: [{{name: insert_tool, weight: 2}}, {{name: bootstrap_demos}}, {{name: param_search}},
              {{name: add_node}}]
  cascade: {{minibatch: 3}}
rl: {{enabled: true, every: 1, steps: 2, group_size: 2, inputs_per_step: 2, lr: 1.0e-3,
      max_completion_tokens: 16}}
"""
ROOT = Path(__file__).resolve().parents[2]
SLOW_REWARD = """
import re, time
def score(answer, example):
    time.sleep(0.3)  # spreads the phases out so that each kill lands where it is aimed
    return float(answer.strip() == example.answer)
"""

# (what the run has just reported, extra seconds to wait) before each SIGKILL: one or more per
# phase. The run reports in JSON lines, so the test knows where each kill landed.
KILLS = [
    (r'"name": "seeds"', 0.0),
    (r'"name": "seeds"', 0.4),
    (r'"message": "seed ', 0.0),              # seeds scored, generation 0 about to commit
    (r'"name": "gen 1: evaluate', 0.0),       # children just built (mutation), evaluation starts
    (r'"name": "gen 1: evaluate', 0.3),
    (r'"name": "gen 1: RL on', 0.0),          # RL rollouts
    (r'"name": "gen 1: RL on', 0.8),          # RL optimizer step
    (r'"name": "gen 1: re-evaluate', 0.0),    # checkpoint just written, generation uncommitted
    (r'"name": "gen 2: evaluate', 0.1),
    (r'"name": "gen 2: RL on', 0.5),
    (r'"name": "gen 3: evaluate', 0.1),       # the last generation: a search under v2, no phase
    (r'"name": "test: best agent', 0.0),      # the final test evaluation
]


def write_task(tmp_path: Path, model: Path) -> None:
    (tmp_path / "task.yaml").write_text(SPEC.format(root=ROOT, model=model))
    (tmp_path / "slow_reward.py").write_text(SLOW_REWARD)


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_orphans():
    """A run a failed test leaves going is killed: it would take the CPU of every later test."""
    yield
    for proc in STARTED:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    STARTED.clear()


# `evoagent` as a terminal starts it: Ctrl-C raises KeyboardInterrupt. A process started in the
# background by a non-interactive shell (`cmd &`, as CI scripts often are) inherits SIGINT
# ignored, and Python keeps it so, which would leave nothing for the Ctrl-C test to see.
EVOAGENT = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from evoagent.cli import main; main()")


def start(cwd: Path, out: str, log: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", EVOAGENT, "run", "task.yaml", "--output", out, "--progress", "jsonl",
         *extra],
        cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    STARTED.append(proc)
    return proc


def wait_for(proc: subprocess.Popen, log: Path, pattern: str, limit: float = 240) -> bool:
    """True once ``pattern`` is in the log; False if the run ended first."""
    deadline = time.monotonic() + limit
    rx = re.compile(pattern)
    while time.monotonic() < deadline:
        if rx.search(log.read_text(errors="replace")):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    raise AssertionError(f"no {pattern!r} within {limit}s:\n{log.read_text()[-2000:]}")


def last_event(log: Path) -> str:
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            ev = json.loads(line)
            return ev.get("name") or ev.get("message", "")
    return "(starting up)"


def test_sigkill_in_every_phase_then_resume_matches_an_uninterrupted_run(tmp_path, tiny_model_dir, snapshot):
    write_task(tmp_path, tiny_model_dir)
    ref = start(tmp_path, "ref", tmp_path / "ref.log")
    assert ref.wait(timeout=600) == 0, (tmp_path / "ref.log").read_text()[-3000:]

    landed = []
    for i, (pattern, delay) in enumerate(KILLS):
        log = tmp_path / f"cut{i}.log"
        proc = start(tmp_path, "cut", log, *(["--resume"] if i else []))
        if wait_for(proc, log, pattern):
            time.sleep(delay)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            landed.append((pattern, last_event(log)))
        else:  # resumed past that phase already: nothing to kill
            assert proc.returncode == 0, log.read_text()[-3000:]
    assert len(landed) >= 10, landed
    print("kills landed after:", *(event for _, event in landed), sep="\n  ")

    final = start(tmp_path, "cut", tmp_path / "final.log", "--resume")
    assert final.wait(timeout=600) == 0, (tmp_path / "final.log").read_text()[-3000:]

    cut, refdir = tmp_path / "cut" / "crash", tmp_path / "ref" / "crash"
    with sqlite3.connect(cut / "archive.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        ids = [r[0] for r in db.execute("SELECT id FROM agents")]
        assert len(ids) == len(set(ids))
        assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
        versions = [r[0] for r in db.execute("SELECT weights_version FROM rl_checkpoints")]
    assert versions == [1, 2]
    assert snapshot(cut) == snapshot(refdir)
    cut_result, ref_result = (json.loads((d / "result.json").read_text()) for d in (cut, refdir))
    # The spent budget counts the model work done: a restarted process begins with an empty
    # completion cache, so what the uninterrupted run got from its cache is generated again.
    assert cut_result.pop("calls") >= ref_result.pop("calls")
    assert cut_result.pop("tokens") >= ref_result.pop("tokens")
    assert cut_result == ref_result


def test_ctrl_c_stops_cleanly_says_how_to_resume_and_one_writer_only(tmp_path, tiny_model_dir):
    write_task(tmp_path, tiny_model_dir)
    task = tmp_path / "task.yaml"  # long enough that it is still running when we interrupt it
    task.write_text(task.read_text().replace("generations: 3", "generations: 40"))
    log = tmp_path / "run.log"
    proc = start(tmp_path, "pop", log)
    assert wait_for(proc, log, r'"name": "gen 1: evaluate')

    second = subprocess.run(
        [sys.executable, "-m", "evoagent", "run", "task.yaml", "--output", "pop", "--resume"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert second.returncode == 2
    assert "another evoagent process is writing to" in " ".join(second.stderr.split())

    proc.send_signal(signal.SIGUSR1)  # kill -USR1: every thread's stack, and the run goes on
    assert wait_for(proc, log, r"most recent call first", limit=30)
    assert proc.poll() is None

    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(timeout=120)  # a hang guard, not a speed test: a loaded machine is slow
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # every thread's stack into the log: where it hangs
        time.sleep(3)
        pytest.fail(f"Ctrl-C did not stop the run in 120s; its stacks:\n{log.read_text()[-6000:]}")
    stopped_after = time.monotonic() - sent
    out = log.read_text()
    assert rc == 130, out[-2000:]
    assert "continue with: evoagent run task.yaml --output pop --resume" in " ".join(out.split())
    assert "Traceback" not in out
    print(f"Ctrl-C stopped the run in {stopped_after:.1f}s")
