"""A trained-looking LoRA adapter for the weight-sync tests of every backend: the real training
copy under ``attach_lora``, its B matrices drawn at random (a fresh adapter's are 0, which
changes nothing)."""

from __future__ import annotations

import torch

from evoagent.llm.weights import BASE_ADAPTER
from evoagent.rl.config import RLConfig
from evoagent.rl.policy import add_node_adapters, attach_lora


def trained_lora(backend, rank: int, std: float):
    """``backend``'s training copy under a rank-``rank`` adapter with B ~ N(0, std)."""
    model = attach_lora(backend.trainable_model(), RLConfig(enabled=True, lora_rank=rank, lora_alpha=2 * rank))
    set_lora_b(model, std)
    return model


def node_loras(model, nodes, rank: int, std: float):
    """``model`` (a fresh transformers copy) under ``rl.adapters: per_node`` with an adapter for
    each of ``nodes``, B ~ N(0, std); the never-trained base adapter keeps B = 0, as training
    leaves it."""
    cfg = RLConfig(enabled=True, lora_rank=rank, lora_alpha=2 * rank, adapters="per_node")
    peft = attach_lora(model, cfg)
    add_node_adapters(peft, nodes, cfg, seed=0)
    set_lora_b(peft, std)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if name.split(".")[-2] == BASE_ADAPTER:
                p.zero_()
    return peft


def set_lora_b(model, std: float, seed: int = 1) -> None:
    """Draw every LoRA B matrix from N(0, std) (std 0: zero them, the base weights again)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, std) if std > 0 else p.zero_()
