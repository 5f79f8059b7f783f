"""evoagent/llm/attention.py: the hf backend serves a grouped-query model without expanding its
K/V heads, with exactly the numbers transformers' own sdpa gives, and trains on sdpa."""

from __future__ import annotations

import asyncio

import pytest
import transformers.integrations.sdpa_attention as hf_sdpa

from evoagent.llm.attention import NAME
from evoagent.llm.types import GenerationRequest

PROMPTS = ["2+2?", "a much longer question about the sum of twelve and thirteen and fourteen", "hi", "7*8"]


def generate(backend) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    reqs = [GenerationRequest(({"role": "user", "content": p},), max_tokens=12, temperature=1.0, seed=i)
            for i, p in enumerate(PROMPTS)]
    return [(tuple(g.completion_ids), tuple(g.logprobs)) for g in asyncio.run(backend.generate(reqs))]


def test_serving_gives_sdpas_tokens_and_logprobs_exactly(tiny_backend):
    ours, theirs = tiny_backend(), tiny_backend()
    assert ours.model.config._attn_implementation == NAME
    theirs.model.set_attn_implementation("sdpa")
    assert generate(ours) == generate(theirs)  # a padded batch: the mask and the grouped heads together


def test_serving_never_copies_the_kv_heads(tiny_backend, monkeypatch):
    def refuse(*_):
        raise AssertionError("repeat_kv was called: the KV cache copied once per query head")

    monkeypatch.setattr(hf_sdpa, "repeat_kv", refuse)
    assert len(generate(tiny_backend())) == len(PROMPTS)
    plain = tiny_backend()
    plain.model.set_attn_implementation("sdpa")  # transformers' own: the copy this check sees
    with pytest.raises(Exception, match="repeat_kv was called"):
        generate(plain)


def test_the_training_copy_attends_with_sdpa(tiny_backend):
    backend = tiny_backend()
    assert backend.trainable_model().config._attn_implementation == "sdpa"
    assert backend.model.config._attn_implementation == NAME
