"""The weights a trained policy serves with: LoRA merged into the base, named as the plain
transformers model names them.

Training keeps its own copy of the policy (LoRA adapter unmerged, so the base stays exact and
doubles as the KL reference); generation runs on another copy whose linear layers hold
``W + B A * scale`` in the generation dtype. Unmerged LoRA would cost every decoded token two
extra small matmuls per projection; merged weights cost nothing (bench/backend_throughput.py:
lora_eval_ratio against lora_unmerged_ratio). Merging into a separate copy avoids the rounding drift of
merge/unmerge in place on bf16 weights.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from torch import Tensor, nn


def served_weights(trained: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of every weight training may have changed, LoRA merged (float32 sums).

    Under a LoRA adapter only the adapted projections change; with full fine-tuning every
    parameter (tied ones under each of their names).
    """
    if not isinstance(trained, PeftModel):
        yield from trained.named_parameters(remove_duplicate=False)
        return
    for name, base, delta in _lora_layers(trained):
        yield name, base.float() + delta


@torch.no_grad()
def load_served(target: nn.Module, trained: nn.Module) -> int:
    """Copy ``trained``'s served weights into ``target`` (in its dtype, the sum rounded once);
    returns how many tensors changed. A name ``target`` lacks is a ValueError (not the same
    architecture)."""
    params = dict(target.named_parameters(remove_duplicate=False))

    def param(name: str) -> Tensor:
        if name not in params:
            raise ValueError(f"the served model has no parameter {name!r}")
        return params[name]

    if not isinstance(trained, PeftModel):
        for name, value in trained.named_parameters(remove_duplicate=False):
            param(name).copy_(value)
        return len(params)
    n = 0
    for name, base, delta in _lora_layers(trained):
        torch.add(base, delta, out=param(name))  # computed in float32, written in target's dtype
        n += 1
    return n


def _lora_layers(trained: PeftModel) -> Iterator[tuple[str, Tensor, Tensor]]:
    """(name, base weight, float32 delta of the active adapters) of each LoRA layer."""
    for name, module in trained.get_base_model().named_modules():
        if not isinstance(module, LoraLayer):
            continue
        deltas = [module.get_delta_weight(a).float() for a in module.active_adapters if a in module.lora_A]
        if deltas:
            yield f"{name}.weight", module.get_base_layer().weight, sum(deltas[1:], deltas[0])
