"""Prefix KV reuse in the hf backend: the system prompt and demos shared by an agent's inputs,
an RL group's identical prompts and a loop episode's turns are prefilled once, and nothing a
request gets changes (float32: exact tokens, logprobs to 1e-5)."""

from __future__ import annotations

import asyncio

import torch

from evoagent.llm.types import GenerationRequest

SYSTEM = "You are a helpful assistant. Think step by step. The calculator result is 42."


def chat(user: str, **kw) -> GenerationRequest:
    kw.setdefault("max_tokens", 10)
    return GenerationRequest(({"role": "system", "content": SYSTEM}, {"role": "user", "content": user}), **kw)


def same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.prompt_ids == y.prompt_ids
        assert x.completion_ids == y.completion_ids
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)


REQUESTS = [
    chat("Calculate 12 + 7."),
    chat("What is 95 - 21?", temperature=1.0, seed=2),
    # an RL group: one prompt, four seeds
    *(chat("Question: What is 95 - 21? Draft answer: 74", temperature=0.8, seed=s) for s in range(4)),
    GenerationRequest(({"role": "user", "content": "no system prompt here"},), max_tokens=6),
]


def test_shared_prefixes_are_prefilled_once_with_the_same_results(tiny_backend):
    plain = tiny_backend(cache=False, kv_cache_mb=0)
    reuse = tiny_backend(cache=False)
    expected = asyncio.run(plain.generate(REQUESTS))
    got = asyncio.run(reuse.generate(REQUESTS))
    same(expected, got)
    assert plain.prefilled_tokens == sum(len(g.prompt_ids) for g in expected)
    system_ids = len(reuse.chat.render([{"role": "system", "content": SYSTEM}])) - 4
    # the system prompt went through the model once for six rows, the group's prompt once for four
    assert reuse.prefilled_tokens <= plain.prefilled_tokens - 5 * system_ids
    assert len(reuse.prefixes) >= 2


def test_a_later_call_finds_the_prefix_an_earlier_call_stored(tiny_backend):
    plain = tiny_backend(cache=False, kv_cache_mb=0)
    reuse = tiny_backend(cache=False)
    asyncio.run(reuse.generate(REQUESTS[:2]))
    before, hits = reuse.prefilled_tokens, reuse.prefixes.hits
    later = [chat("Calculate 3 * 4."), chat("Draft answer: 74", temperature=1.0, seed=5)]
    same(asyncio.run(plain.generate(later)), asyncio.run(reuse.generate(later)))
    prompt = sum(len(reuse.chat.prompt(r)) for r in later)
    assert reuse.prefixes.hits >= hits + 2
    assert reuse.prefilled_tokens - before < prompt / 2


def test_a_loop_turn_prefills_only_the_new_observation(tiny_backend):
    plain = tiny_backend(cache=False, kv_cache_mb=0)
    reuse = tiny_backend(cache=False)
    first = chat("Calculate 12 + 7.", temperature=1.0, seed=3, continued=True)
    (a,) = asyncio.run(plain.generate([first]))
    (b,) = asyncio.run(reuse.generate([first]))
    same([a], [b])
    turn = (*first.messages, {"role": "assistant", "content": a.text},
            {"role": "user", "content": "Observation: 19"})
    second = GenerationRequest(turn, max_tokens=8, temperature=1.0, seed=4,
                               prefix_ids=a.prompt_ids + a.completion_ids)
    before = reuse.prefilled_tokens
    (a2,) = asyncio.run(plain.generate([second]))
    (b2,) = asyncio.run(reuse.generate([second]))
    same([a2], [b2])
    new = len(b2.prompt_ids) - len(b.prompt_ids) - len(b.completion_ids)
    assert reuse.prefilled_tokens - before == new + 1  # the last sampled token was never fed
    assert len(reuse.prefixes) == 0  # the turn's KV was used up by the turn that extended it


def test_rows_of_different_lengths_leave_the_batch_without_changing_the_others(tiny_backend):
    """Finished rows are dropped from the decode; the rest decode exactly as they would alone."""
    requests = [chat(f"q {n}", max_tokens=n, temperature=0.9, seed=n) for n in (1, 2, 3, 5, 8, 13, 21)]
    together = asyncio.run(tiny_backend(cache=False).generate(requests))
    alone = [asyncio.run(tiny_backend(cache=False, kv_cache_mb=0).generate([r]))[0] for r in requests]
    same(together, alone)
    assert [len(g.completion_ids) for g in together] == [1, 2, 3, 5, 8, 13, 21]


def test_a_tiny_store_evicts_and_still_answers_right(tiny_backend):
    plain = tiny_backend(cache=False, kv_cache_mb=0)
    roomy = tiny_backend(cache=False)
    small = tiny_backend(cache=False, kv_cache_mb=1)
    small.prefixes.max_bytes = 20_000  # room for about one prefix of the tiny model
    for _ in range(2):  # the second round finds what the first stored, where it is still there
        expected = asyncio.run(plain.generate(REQUESTS))
        asyncio.run(roomy.generate(REQUESTS))
        same(expected, asyncio.run(small.generate(REQUESTS)))
    assert small.prefixes.bytes <= 20_000 < roomy.prefixes.bytes
    assert 0 < len(small.prefixes) < len(roomy.prefixes) and small.prefixes.hits > 0  # evicted, still reused
    assert small.prefilled_tokens > roomy.prefilled_tokens  # what the evictions cost
