"""``evoagent run --ray``: candidates evaluated on Ray workers give the archive a local run
gives (float32), a worker killed mid-run is replaced and its evaluation resubmitted, and all
of Ray's traffic stays on loopback (each Ray run is inside ``unshare -rn`` with only ``lo`` up).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evoagent.archive import Archive

pytest.importorskip("ray", reason="Ray is not installed (pip install 'evoagent-ml[distributed]')")
if shutil.which("unshare") is None or shutil.which("ip") is None:
    pytest.skip("needs unshare and ip (util-linux, iproute2)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
# every address a socket can listen on in a namespace whose only interface is lo
LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1", "0.0.0.0", "::", "*")
SPEC = """
name: dist
seed: 2
task:
  description: arithmetic
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 40,
            options: {{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}}}
  splits: {{train: 4, val: 6, test: 4}}
  tools: [calculator]
graphs: [{root}/graphs/direct.yaml, {root}/graphs/cot.yaml]
policy: {{kind: hf, model: "{model}", dtype: float32, max_batch: 16, max_context: 512}}
evolve:
  generations: 2
  children: 2
  operators: [{{name: insert_tool}}, {{name: bootstrap_demos}}, {{name: param_search}}]
  cascade: {{minibatch: 3}}
rl: {{enabled: true, every: 1, steps: 1, group_size: 2, inputs_per_step: 2, lr: 1.0e-3}}
"""
# Runs inside the namespace: evoagent with --ray, a watcher that samples the listening
# sockets and (with KILL) kills one Ray worker once the first generation's evaluation starts.
DRIVER = """
import json, os, signal, subprocess, sys, time
cmd = [sys.executable, "-m", "evoagent", "run", sys.argv[1], "--output", sys.argv[2],
       "--progress", "jsonl", "--ray", "--ray-workers", "2"]  # a bare --ray: a local cluster
run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
events, killed, listening = [], None, set()
for line in run.stdout:
    events.append(line)
    out = subprocess.run(["ss", "-tlnH"], capture_output=True, text=True).stdout
    listening |= {row.split()[3] for row in out.splitlines() if row.strip()}
    if os.environ.get("KILL") and killed is None and '"gen 1: evaluate' in line:
        pids = subprocess.run(["pgrep", "-f", "ray::EvalWorker"], capture_output=True, text=True).stdout.split()
        if pids:
            killed = int(pids[0])
            os.kill(killed, signal.SIGKILL)
links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
print("RESULT " + json.dumps({"code": run.wait(), "killed": killed, "listening": sorted(listening),
                              "links": links, "log": "".join(events)}))
"""


def write_task(tmp_path: Path, model: Path) -> Path:
    task = tmp_path / "task.yaml"
    task.write_text(SPEC.format(root=ROOT, model=model))
    return task


def ray_run(task: Path, out: Path, kill: bool) -> dict:
    script = task.parent / "driver.py"
    script.write_text(textwrap.dedent(DRIVER))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled", "KILL": "1" if kill else ""}
    proc = subprocess.run(
        ["unshare", "-rn", "bash", "-c", f"ip link set lo up && {sys.executable} {script} {task} {out}"],
        capture_output=True, text=True, env=env, timeout=900,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line.removeprefix("RESULT "))


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("local")
    task = write_task(tmp, tiny_model_dir)
    subprocess.run([sys.executable, "-m", "evoagent", "run", str(task), "--output", str(tmp / "pop"),
                    "--progress", "quiet"], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                   capture_output=True, timeout=900)
    return tmp / "pop" / "dist"


def test_ray_workers_give_the_local_archive_on_loopback_only(local_run, tiny_model_dir, tmp_path, snapshot):
    res = ray_run(write_task(tmp_path, tiny_model_dir), tmp_path / "pop", kill=False)
    assert res["code"] == 0, res["log"][-3000:]
    assert snapshot(tmp_path / "pop" / "dist") == snapshot(local_run)
    with Archive(local_run, write=False) as here, Archive(tmp_path / "pop" / "dist", write=False) as there:
        # the budget counts the workers' completions (each worker caches apart: never fewer)
        assert there.usage()[0] >= here.usage()[0] > 0
    assert [ln.split(":")[1].strip() for ln in res["links"].splitlines()] == ["lo"]
    assert res["listening"], "Ray listened on nothing?"
    assert all(a.rsplit(":", 1)[0].strip("[]") in LOOPBACK for a in res["listening"]), res["listening"]


def test_a_killed_worker_is_replaced_and_nothing_is_lost(local_run, tiny_model_dir, tmp_path, snapshot):
    res = ray_run(write_task(tmp_path, tiny_model_dir), tmp_path / "pop", kill=True)
    assert res["code"] == 0, res["log"][-3000:]
    assert res["killed"] is not None
    assert "a Ray worker died evaluating" in res["log"]
    assert snapshot(tmp_path / "pop" / "dist") == snapshot(local_run)
