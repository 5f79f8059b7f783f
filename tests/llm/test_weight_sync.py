"""Weight sync of the hf backend: RL trains a copy, generation serves the adapter merged."""

from __future__ import annotations

import asyncio

import torch
from adapters import trained_lora
from peft import PeftModel

from evoagent.llm.types import GenerationRequest
from evoagent.rl.policy import token_logprobs


def req(text: str, **kw) -> GenerationRequest:
    kw.setdefault("max_tokens", 8)
    return GenerationRequest(({"role": "user", "content": text},), **kw)


def test_generation_serves_the_trained_adapter_merged(tiny_backend):
    backend = tiny_backend()
    r = req("Calculate 12 + 7.")
    (before,) = asyncio.run(backend.generate([r]))
    model = trained_lora(backend, 4, 0.5)
    backend.sync_weights(model)
    assert not isinstance(backend.model, PeftModel)  # plain weights: no adapter on the decode path
    (after,) = asyncio.run(backend.generate([r]))
    assert not after.cached  # the sync retired what the old weights generated
    assert after.completion_ids != before.completion_ids
    ids = torch.tensor([after.prompt_ids + after.completion_ids])
    with torch.no_grad():
        want = token_logprobs(model.eval(), ids, torch.ones_like(ids))[0, len(after.prompt_ids) :]
    assert torch.allclose(torch.tensor(after.logprobs), want, atol=1e-4)
    # training kept its own exact base (the KL reference): with the adapter off it scores the
    # first completion exactly as the untrained backend sampled it
    ids = torch.tensor([before.prompt_ids + before.completion_ids])
    with torch.no_grad(), model.disable_adapter():
        ref = token_logprobs(model, ids, torch.ones_like(ids))[0, len(before.prompt_ids) :]
    assert torch.allclose(torch.tensor(before.logprobs), ref, atol=1e-5)


def test_full_finetuning_syncs_every_weight(tiny_backend):
    backend = tiny_backend()
    model = backend.trainable_model()
    assert model is backend.trainable_model() and model is not backend.model
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    backend.sync_weights(model)
    for (name, served), trained in zip(backend.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(served, trained), name
