"""The hf backend on a tiny random model: batching must not change what a request gets, the
logprobs must be the model's, the cache must respect weight versions."""

from __future__ import annotations

import asyncio

import pytest
import torch

from evoagent.llm.types import GenerationRequest


def req(text: str, **kw) -> GenerationRequest:
    kw.setdefault("max_tokens", 8)
    return GenerationRequest(({"role": "user", "content": text},), **kw)


def test_batched_equals_one_at_a_time(tiny_backend):
    """Left padding and per-request seeds: a request's tokens don't depend on its batch."""
    requests = [req("Calculate 12 + 7."), req("hi", temperature=1.0, seed=3),
                req("What is 95 - 21? Think step by step.", temperature=0.7, seed=9)]
    together = asyncio.run(tiny_backend(cache=False).generate(requests))
    alone = [asyncio.run(tiny_backend(cache=False).generate([r]))[0] for r in requests]
    for a, b in zip(together, alone, strict=True):
        assert a.completion_ids == b.completion_ids
        assert a.prompt_ids == b.prompt_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_logprobs_are_the_models_own(tiny_backend):
    """Token in, token out: re-scoring prompt+completion reproduces the reported logprobs."""
    backend = tiny_backend(cache=False)
    (g,) = asyncio.run(backend.generate([req("Calculate 12 + 7.", temperature=1.0, seed=1)]))
    assert len(g.completion_ids) == len(g.logprobs) > 0
    ids = torch.tensor([g.prompt_ids + g.completion_ids])
    with torch.no_grad():
        logits = backend.model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1)
    n = len(g.prompt_ids)
    expected = [float(lp[n - 1 + i, t]) for i, t in enumerate(g.completion_ids)]
    assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(expected), atol=1e-4)


def test_seeded_sampling_reproduces_and_seeds_differ(tiny_backend):
    backend = tiny_backend(cache=False)
    a = asyncio.run(backend.generate([req("hi", temperature=1.5, seed=1, max_tokens=16)]))[0]
    b = asyncio.run(backend.generate([req("hi", temperature=1.5, seed=1, max_tokens=16)]))[0]
    c = asyncio.run(backend.generate([req("hi", temperature=1.5, seed=2, max_tokens=16)]))[0]
    assert a.completion_ids == b.completion_ids
    assert a.completion_ids != c.completion_ids


def test_cache_hits_only_within_a_weights_version(tiny_backend):
    backend = tiny_backend()
    r = req("Calculate 12 + 7.")
    first = asyncio.run(backend.generate([r]))[0]
    again = asyncio.run(backend.generate([r]))[0]
    assert not first.cached and again.cached and again.completion_ids == first.completion_ids
    backend.weights_version = 1
    fresh = asyncio.run(backend.generate([r]))[0]
    assert not fresh.cached and fresh.weights_version == 1


def test_concurrent_callers_share_model_calls(tiny_backend):
    """The batcher gathers requests from many coroutines into few batches."""
    backend = tiny_backend(cache=False, max_batch=16, batch_wait_ms=20)

    async def many():
        return await asyncio.gather(*(backend.generate([req(f"q {i}")]) for i in range(12)))

    out = asyncio.run(many())
    assert len(out) == 12
    assert backend._batcher.calls < 12 and backend._batcher.largest > 1


def test_budget_and_context_limits(tiny_backend):
    backend = tiny_backend(cache=False, max_context=64)
    long = "Calculate 12 + 7. " * 100
    (g,) = asyncio.run(backend.generate([req(long, max_tokens=5)]))
    assert len(g.prompt_ids) <= 64 - 5
    assert len(g.completion_ids) <= 5
    assert g.finish_reason in ("stop", "length")


def test_a_call_over_the_token_budget_is_decoded_in_parts_with_the_same_results(tiny_backend):
    requests = [req("x" * n, max_tokens=6, temperature=0.9, seed=n) for n in (3, 40, 12, 25, 7)]
    whole = asyncio.run(tiny_backend(cache=False).generate(requests))
    parted = tiny_backend(cache=False, max_batch_tokens=60)
    calls = []
    decode = parted._decode
    parted._decode = lambda rs, ps, *served: calls.append(len(rs)) or decode(rs, ps, *served)
    got = asyncio.run(parted.generate(requests))
    assert len(calls) > 1 and sum(calls) == len(requests)
    assert [g.completion_ids for g in got] == [g.completion_ids for g in whole]


def test_a_context_longer_than_the_model_window_is_refused(tiny_backend):
    from evoagent.errors import BackendError

    with pytest.raises(BackendError, match=r"policy\.max_context: 4096 exceeds .*2048 positions"):
        tiny_backend(max_context=4096)


def test_continuation_appends_only_the_new_turns(tiny_backend, tiny_tokenizer):
    backend = tiny_backend()
    chat = ({"role": "user", "content": "Calculate 12 + 7."},)
    first = asyncio.run(backend.generate([GenerationRequest(chat, max_tokens=5, temperature=1.0, seed=3)]))[0]
    turn = (*chat, {"role": "assistant", "content": first.text}, {"role": "user", "content": "Observation: 19"})
    prefix = first.prompt_ids + first.completion_ids
    second = asyncio.run(backend.generate(
        [GenerationRequest(turn, max_tokens=5, temperature=1.0, seed=4, prefix_ids=prefix)]))[0]
    assert second.prompt_ids[: len(prefix)] == prefix
    new = tiny_tokenizer.decode(list(second.prompt_ids[len(prefix) :]))
    closing = "" if prefix[-1] in backend.eos_ids else "<|im_end|>"
    assert new == closing + "\n<|im_start|>user\nObservation: 19<|im_end|>\n<|im_start|>assistant\n"
