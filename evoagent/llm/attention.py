"""Attention for the hf backend's models on CPU: grouped-query heads without copying the cache.

transformers' ``sdpa`` attention expands the K/V heads of a grouped-query model (SmolLM2 and
Qwen2.5 share each K/V head among 3 to 7 query heads) to one per query head (``repeat_kv``)
whenever an attention mask is given, because CUDA's fast kernels need it. Our batches always
carry a mask (rows of different lengths), so every decode step copied the whole KV cache, in
every layer, before reading it again. On CPU, torch's SDPA takes the grouped heads and the mask
together (``enable_gqa``) and gives the same numbers without the copy; elsewhere (CUDA, a
model without grouped heads, no mask) this is transformers' own ``sdpa``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "evoagent_sdpa"


def gqa_sdpa(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``sdpa``, but a masked grouped-query call on CPU reads the K/V heads as they are.

    Two calls go to transformers' own ``sdpa`` whatever the device: one with a learned
    ``position_bias`` (T5-style relative attention), which it folds into the mask, and one with a
    ``cache`` (the paged cache of transformers' continuous batching), which updates K/V inside
    the attention function. Neither comes from our backend's ``generate``; a user's own call may
    bring them.
    """
    plain = (query.device.type != "cpu" or attention_mask is None
             or getattr(module, "num_key_value_groups", 1) == 1
             or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, gqa_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks sdpa gets (none is no mask at all)


def serve_with_gqa(model: Any) -> None:
    """Have ``model`` (a transformers model that uses ``sdpa``) attend through ``gqa_sdpa``."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)


def train_with_sdpa(model: Any) -> None:
    """Give a training copy transformers' own ``sdpa`` back (its gradients stay as they were)."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME:
        model.set_attn_implementation("sdpa")
