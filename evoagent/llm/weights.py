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

BASE_ADAPTER = "_base"  # rl.adapters per_node: the never-trained adapter a PeftModel must start with
NODE_PREFIX = "node__"  # peft's name of a node's adapter: no module or key is named so ("model",
# "mlp" or "default" are valid node ids, and peft treats adapter names as key parts)


def adapter_name(node: str) -> str:
    """peft's name of ``node``'s adapter."""
    return NODE_PREFIX + node


def node_adapters(trained: nn.Module) -> list[str] | None:
    """Per node (``rl.adapters: per_node``): the node ids that have an adapter of their own, in
    the order they were added (none before the first trained step). None for a model whose one
    set of weights serves every node."""
    if not isinstance(trained, PeftModel) or BASE_ADAPTER not in trained.peft_config:
        return None
    return [name.removeprefix(NODE_PREFIX) for name in trained.peft_config if name.startswith(NODE_PREFIX)]


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
def load_served(target: nn.Module, trained: nn.Module, node: str | None = None) -> int:
    """Copy ``trained``'s served weights into ``target`` (in its dtype, the sum rounded once);
    returns how many tensors changed. ``node`` merges that node's adapter of a per-node model
    instead of the active ones. A name ``target`` lacks is a ValueError (not the same
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
    for name, base, delta in _lora_layers(trained, adapter_name(node) if node is not None else None):
        torch.add(base, delta, out=param(name))  # computed in float32, written in target's dtype
        n += 1
    return n


def _lora_layers(trained: PeftModel, adapter: str | None = None) -> Iterator[tuple[str, Tensor, Tensor]]:
    """(name, base weight, float32 delta of ``adapter`` or else the active adapters) of each
    LoRA layer."""
    for name, module in trained.get_base_model().named_modules():
        if not isinstance(module, LoraLayer):
            continue
        names = [adapter] if adapter is not None else module.active_adapters
        deltas = [module.get_delta_weight(a).float() for a in names if a in module.lora_A]
        if deltas:
            yield f"{name}.weight", module.get_base_layer().weight, sum(deltas[1:], deltas[0])
