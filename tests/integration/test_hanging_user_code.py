"""``evoagent run`` with user code that hangs: a sync plug-in operator that sleeps and a
``python`` reward that sleeps on some inputs. Both are killed when their time is up, the
run finishes and exits, and nothing it started is left running."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from evoagent.archive import Archive

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = '''
import time

def sleepy(parents, ctx):
    time.sleep(3600)

def reward(answer, example):
    if example.id.endswith("3"):
        time.sleep(3600)
    return 0.5
'''
SPEC = f"""
name: hang
seed: 1
task:
  description: arithmetic
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 40,
            options: {{min_terms: 2, max_terms: 2, min_digits: 2, max_digits: 2}}}}
  splits: {{train: 2, val: 8, test: 4}}
  reward: {{kind: python, ref: "hang_plugin:reward", timeout_s: 1}}
graphs: [{ROOT}/graphs/direct.yaml]
policy: {{kind: scripted}}
evolve:
  generations: 1
  children: 2
  operators: [{{name: "hang_plugin:sleepy"}}]
  operator_timeout_s: 2
  cascade: {{minibatch: 8}}
"""


def session_alive(sid: int) -> list[str]:
    """Processes of session ``sid`` still running (zombies excluded)."""
    out = subprocess.run(["ps", "-eo", "sid=,stat=,args="], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if ln.split()[0] == str(sid) and not ln.split()[1].startswith("Z")]


def test_hanging_operator_and_reward_are_killed_and_the_run_exits(tmp_path):
    (tmp_path / "hang_plugin.py").write_text(textwrap.dedent(PLUGIN))
    (tmp_path / "task.yaml").write_text(SPEC)
    out = tmp_path / "pop"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "evoagent", "run", str(tmp_path / "task.yaml"), "--output", str(out),
         "--progress", "quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
    )
    try:
        log, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 0, log
    assert time.monotonic() - start < 150
    with Archive(out / "hang", write=False) as a:
        crashed = [r for r in a.agents() if r.status == "crashed"]
        assert crashed and all("timed out after 2s" in r.reason for r in crashed)
        seed = next(r for r in a.agents() if r.operator == "seed")
        trajectories = a.trajectories(seed.id, "val", 0)
        timed_out = [t for t in trajectories if t.input_id.endswith("3")]
        assert timed_out and all(t.reward == 0.0 and "timed out after 1s" in t.error for t in timed_out)
        assert all(t.reward == 0.5 for t in trajectories if not t.input_id.endswith("3"))
    deadline = time.monotonic() + 10
    while session_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not session_alive(proc.pid)
