"""Shared-prefix packing: rows that begin with the same ids (the G samples of one GRPO group,
an agent's system prompt and demos) go through the model as one sequence.

A group's rows ``[P, r_1]``, ..., ``[P, r_G]`` become one packed row ``[P, r_1, ..., r_G]``
whose attention mask lets each ``r_k`` see the prefix ``P`` and itself (causally) but no other
``r_j``, and whose position ids restart at ``len(P)`` for every ``r_k``: each token sees exactly
what it saw in its own row, so logprobs (and their gradients) are those of the rows, up to
float rounding, while the prefix is computed once instead of G times (Prefix Grouper, Liu et
al. 2025). Where the prompt is long and the completions short, as with few-shot demos, that is
most of a step's compute.

The attention mask is a 4D boolean tensor that transformers passes through as is; only the
``sdpa`` and ``eager`` attention implementations are used with it. Every query of a packed row
attends at least to itself (padding too), so no softmax row is empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from evoagent.llm.kv import common_prefix

MIN_SHARED = 16  # rows are grouped only when they share at least this many leading ids
MIN_SAVING = 0.2  # pack only when it removes at least this share of the batch's tokens
ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class Packed:
    """Packed rows plus where each original token's prediction sits in them.

    Attributes:
        input_ids: (P, W) long.
        attention_mask: (P, 1, W, W) bool (True: may attend), or additive float for ``eager``.
        position_ids: (P, W) long.
        source: (B, L) long: for original position t, the flat index (row * W + col) of the
            packed position that holds the same hidden state; -1 on padding.
    """

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    source: Tensor


def pack(input_ids: Tensor, attention_mask: Tensor, pad_id: int, attention: str) -> Packed | None:
    """Pack right-padded rows that share prefixes; None when packing would save too little
    (fewer than ``MIN_SAVING`` of the tokens) or the attention implementation takes no 4D mask."""
    if attention not in ATTENTION:
        return None
    lengths = attention_mask.sum(dim=1).tolist()
    rows = [input_ids[b, : lengths[b]].tolist() for b in range(len(lengths))]
    order = sorted(range(len(rows)), key=lambda b: rows[b])
    groups: list[tuple[list[int], int]] = []  # (original rows, shared prefix length)
    for b in order:
        if groups:
            members, shared = groups[-1]
            n = min(common_prefix(rows[members[0]], rows[b]), shared, lengths[b] - 1)
            if n >= MIN_SHARED:
                groups[-1] = ([*members, b], n)
                continue
        groups.append(([b], lengths[b]))
    groups = [(m, s if len(m) > 1 else 0) for m, s in groups]
    saved = sum((len(m) - 1) * s for m, s in groups)
    if saved < MIN_SAVING * sum(lengths):
        return None
    width = max(s + sum(lengths[b] - s for b in m) for m, s in groups)
    n_rows = len(groups)
    ids = torch.full((n_rows, width), pad_id, dtype=torch.long)
    pos = torch.zeros((n_rows, width), dtype=torch.long)
    seg = torch.full((n_rows, width), -1, dtype=torch.long)  # 0: prefix, k: member k, -1: pad
    source = torch.full(input_ids.shape, -1, dtype=torch.long)
    for p, (members, shared) in enumerate(groups):
        first = rows[members[0]]
        ids[p, :shared] = torch.tensor(first[:shared], dtype=torch.long)
        pos[p, :shared] = torch.arange(shared)
        seg[p, :shared] = 0
        col = shared
        for k, b in enumerate(members, start=1):
            rest = lengths[b] - shared
            ids[p, col : col + rest] = torch.tensor(rows[b][shared:], dtype=torch.long)
            pos[p, col : col + rest] = torch.arange(shared, lengths[b])
            seg[p, col : col + rest] = k
            source[b, :shared] = p * width + torch.arange(shared)
            source[b, shared : lengths[b]] = p * width + torch.arange(col, col + rest)
            col += rest
    causal = torch.ones(width, width, dtype=torch.bool).tril()  # (W, W)
    same = (seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == 0)  # (P, W, W) query, key
    mask = causal & same & (seg[:, None, :] >= 0)
    mask |= torch.eye(width, dtype=torch.bool)  # padding attends to itself: no empty softmax row
    mask = mask[:, None]  # (P, 1, W, W)
    device = input_ids.device
    return Packed(ids.to(device), mask.to(device), pos.to(device), source.to(device))


def additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The boolean mask as the additive float mask eager attention expects."""
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, torch.finfo(dtype).min)
