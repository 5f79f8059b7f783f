"""Shared-prefix packing: the rows of a GRPO group run their common prompt once, and every
token's logprob and gradient is what its own row gives."""

from __future__ import annotations

import pytest
import torch

from evoagent.rl import packing, policy
from evoagent.rl.packing import pack
from evoagent.rl.policy import token_logprobs


def rows(vocab: int):
    """Four right-padded rows: three share a 24-id prompt, one is its own."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (24,), generator=g).tolist()
    tails = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 9, 2)]
    alone = torch.randint(3, vocab, (17,), generator=g).tolist()
    seqs = [prompt + t for t in tails] + [alone]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    wanted = mask.clone()
    wanted[:3, :24] = 0  # train on the completions only
    return ids, mask, wanted


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_logprobs_and_gradients_equal_the_rows_own(attention, monkeypatch, make_model):
    model = make_model()
    model.config._attn_implementation = attention
    model.train()
    ids, mask, wanted = rows(64)
    packs = []  # what token_logprobs' own call to pack gave: the path each run took
    monkeypatch.setattr(policy, "pack", lambda *a: packs.append(pack(*a)) or packs[-1])

    def run():
        model.zero_grad()
        lp = token_logprobs(model, ids, mask, 0.8, wanted)
        (lp * torch.linspace(0.5, 1.5, lp.shape[1])).sum().backward()
        return lp.detach(), [p.grad.clone() for p in model.parameters()]

    packed_lp, packed_grads = run()
    monkeypatch.setattr(packing, "MIN_SAVING", 2.0)  # never pack
    plain_lp, plain_grads = run()
    assert packs[0] is not None and packs[1] is None
    assert torch.allclose(packed_lp, plain_lp, atol=1e-5)
    assert (packed_lp[wanted.bool() & (torch.arange(ids.shape[1]) > 0)] != 0).all()
    for a, b in zip(packed_grads, plain_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_rows_without_a_shared_prefix_are_not_packed():
    ids, mask, _ = rows(64)
    assert pack(ids[2:], mask[2:], 0, "sdpa") is None  # one group member and an unrelated row
    assert pack(ids, mask, 0, "flash_attention_2") is None
