"""Served models, end to end against a real OpenAI-compatible server (vLLM's, on 127.0.0.1).

The common real set-up: ``evoagent run`` with the policy in process (trained by RL) and the
mutator on the server (behind a proxy that can take it away). The API key reaches nothing the
run writes, and a server that dies mid-run stops the run cleanly; ``--resume`` finishes it
once the server is back. And the policy itself on the server, trained by RL: its adapters are
loaded into the server and the agents are scored under them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from servers import Proxy

from evoagent.archive import Archive

ROOT = Path(__file__).resolve().parents[2]

TASK = """
seed: 0
task:
  description: Arithmetic such as "Calculate 95 - 21."; the answer is one number.
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 40,
            options: {{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}}}
  splits: {{train: 4, val: 4, test: 4}}
graphs: [{root}/graphs/direct.yaml]
"""
SPEC = "name: served" + TASK + """policy: {{kind: hf, model: "{model}", dtype: float32, max_batch: 16, max_context: 512}}
mutator: {{kind: openai, model: tiny, base_url: "{url}", api_key_env: EVOAGENT_TEST_KEY, retries: 1,
           timeout_s: 20}}
evolve:
  generations: 2
  children: 2
  operators: [{{name: reflective_rewrite}}]
  cascade: {{minibatch: 4}}
rl: {{enabled: true, every: 1, steps: 1, group_size: 2, inputs_per_step: 2, lr: 1.0e-4}}
"""


def evoagent(task: Path, out: Path, *extra: str, on_line=None) -> tuple[int, str]:
    """Run the CLI (jsonl progress); ``on_line(event)`` sees each event as it comes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "evoagent", "run", str(task), "--output", str(out), "--progress", "jsonl", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if on_line is not None and line.startswith("{"):
            on_line(json.loads(line))
    return proc.wait(timeout=600), "".join(lines)


@pytest.mark.slow
def test_served_mutator_keeps_its_key_and_survives_the_server_going_away(
    openai_server, vllm_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("EVOAGENT_TEST_KEY", openai_server.key)
    proxy = Proxy(openai_server.url.removesuffix("/v1"))
    task = tmp_path / "task.yaml"
    task.write_text(SPEC.format(root=ROOT, model=vllm_model_dir, url=proxy.url))
    out = tmp_path / "pop"

    def take_the_server_away(event: dict) -> None:
        if event.get("event") == "generation" and event["generation"] == 1:
            proxy.down = True

    code, log = evoagent(task, out, on_line=take_the_server_away)
    assert code == 2, log
    assert "generation 2 could not proceed" in log and "the mutator backend failed" in log
    assert f"evoagent run {task} --output {out} --resume" in log
    assert proxy.posts > 0  # generation 1 asked the served mutator
    with Archive(out / "served", write=False) as a:
        assert a.last_generation() == (1, 1)  # generation 1 and its RL phase are kept

    proxy.down = False
    code, log2 = evoagent(task, out, "--resume")
    assert code == 0, log2
    with Archive(out / "served", write=False) as a:
        assert a.last_generation() == (2, 1)  # the run ends on the program: no phase after gen 2
    report = subprocess.run([sys.executable, "-m", "evoagent", "report", str(out / "served")],
                            capture_output=True, text=True, check=True)
    written = [p.read_bytes() for p in (out / "served").rglob("*") if p.is_file()]
    for blob in [log.encode(), log2.encode(), report.stdout.encode(), *written]:
        assert openai_server.key.encode() not in blob
    proxy.server.shutdown()


POLICY_SPEC = "name: served_policy" + TASK + """policy: {{kind: openai, model: tiny, base_url: "{url}", api_key_env: EVOAGENT_TEST_KEY,
          weights: "{model}", dtype: float32, max_lora_rank: 8}}
evolve:
  generations: 1
  children: 0  # the weights alone: a phase follows the only generation
rl: {{enabled: true, every: 1, steps: 2, group_size: 4, inputs_per_step: 2, lr: 1.0e-2, lora_rank: 8,
      max_completion_tokens: 16}}
"""


@pytest.mark.slow
def test_rl_trains_a_served_policy_through_its_server(openai_server, vllm_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("EVOAGENT_TEST_KEY", openai_server.key)
    task = tmp_path / "task.yaml"
    task.write_text(POLICY_SPEC.format(root=ROOT, model=vllm_model_dir, url=openai_server.url))
    out = tmp_path / "pop"
    code, log = evoagent(task, out)
    assert code == 0, log
    with Archive(out / "served_policy", write=False) as a:
        (ckpt,) = a.checkpoints()
        assert ckpt["weights_version"] == 1
        rescored = [r for r in a.evaluations() if r.weights_version == 1]
        assert rescored  # the elite were scored again, served by the trained adapter
    res = httpx.get(f"{openai_server.url}/models", headers={"Authorization": f"Bearer {openai_server.key}"})
    assert [m["id"] for m in res.json()["data"]] == ["tiny"]  # the run unloaded its adapters
    written = [p.read_bytes() for p in (out / "served_policy").rglob("*") if p.is_file()]
    assert all(openai_server.key.encode() not in blob for blob in [log.encode(), *written])
