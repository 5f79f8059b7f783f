"""The hf backend's decode loop: prefill a batch laid out by ``evoagent.llm.kv``, then sample
every row with its own temperature, budget, stop strings and seeded RNG.

A plain KV-cached loop rather than ``model.generate``: a request's draws must not depend on
which other requests shared its batch (its own ``torch.Generator``, one uniform per token,
inverse-CDF sampling), or caching and ``--resume`` would not reproduce. Rows that finish leave the batch: once a quarter of the rows
still decoded are done, the cache keeps only the live rows, so a batch of short answers and one
long one does not decode the short ones' padding to the end. Logprobs are
``log_softmax(logits / T)`` of the sampled token in float32 (T = 1 for greedy rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from evoagent.llm.kv import KV, BufferLayer, Rows, fresh_cache, row_kv


@dataclass(frozen=True)
class Sampling:
    """How one row is sampled."""

    temperature: float
    max_tokens: int
    seed: int
    keep_kv: bool = False  # return the row's KV (prompt + completion but its last token)


@dataclass
class Decoded:
    """One row's completion: its tokens, their logprobs and why it ended."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = "length"  # "stop" | "length"
    kv: KV | None = None  # with ``Sampling.keep_kv``


Stopped = Callable[[int, list[int]], bool]  # (row, tokens so far) -> a stop string was hit


def forward(model: Any, rows: Rows, cache_arg: str, last_logits: dict[str, int]) -> Any:
    """One forward over the new ids of ``rows`` on top of its cached columns."""
    return model(
        input_ids=rows.input_ids,
        attention_mask=rows.attention_mask,
        position_ids=rows.position_ids,
        use_cache=True,
        **{cache_arg: rows.cache},
        **last_logits,
    )


@torch.inference_mode()
def decode(
    model: Any,
    rows: Rows,
    sampling: Sequence[Sampling],
    eos_ids: set[int],
    pad_id: int,
    *,
    cache_arg: str,
    last_logits: dict[str, int],
    closing: Callable[[], bool],
    stopped: Stopped,
) -> list[Decoded]:
    """Decode every row of ``rows`` until its end token, stop string or budget.

    A row with ``keep_kv`` gets its KV copied out as it ends (its prompt and every sampled
    token but the last, the one not yet fed back). ``closing()`` true aborts with a
    RuntimeError at the next token.
    """
    b = len(sampling)
    budget = max(s.max_tokens for s in sampling)
    device = rows.input_ids.device
    gens = [torch.Generator().manual_seed(s.seed) for s in sampling]
    temps = torch.tensor([s.temperature if s.temperature > 0 else 1.0 for s in sampling])  # (B,)
    greedy = torch.tensor([s.temperature <= 0 for s in sampling])  # (B,)
    out = [Decoded() for _ in range(b)]
    live = list(range(b))  # slot -> row
    done = [False] * b
    mask = rows.attention_mask  # (b, columns of the cache after this forward)
    pos = rows.position_ids[:, -1:]  # (b, 1)
    result = forward(model, rows, cache_arg, last_logits)
    cache = result.get(cache_arg)
    if not isinstance(cache.layers[0], BufferLayer):
        cache = fresh_cache(cache, mask.shape[1] + budget)
    for _ in range(budget):
        if closing():
            raise RuntimeError("the backend was closed while generating")
        idx = torch.tensor(live)
        logits = result.logits[:, -1, :].float().cpu()  # (b, V)
        lp = torch.log_softmax(logits / temps[idx, None], dim=-1)  # (b, V)
        picked = lp.argmax(-1)  # (b,)
        hot = [slot for slot, row in enumerate(live) if not greedy[row] and not done[row]]
        if hot:  # only the rows that sample pay for it
            picked[hot] = _sample(lp[hot], [gens[live[slot]] for slot in hot])
        nxt = torch.full((len(live),), pad_id, dtype=torch.long)
        for slot, row in enumerate(live):
            if done[row]:
                continue
            tok = int(picked[slot])
            d = out[row]
            d.tokens.append(tok)
            d.logprobs.append(float(lp[slot, tok]))
            nxt[slot] = tok
            if tok in eos_ids or stopped(row, d.tokens):
                done[row], d.finish = True, "stop"
            elif len(d.tokens) >= sampling[row].max_tokens:
                done[row] = True
            if done[row] and sampling[row].keep_kv:
                d.kv = row_kv(cache, slot, mask[slot].nonzero().squeeze(-1))
        keep = [slot for slot, row in enumerate(live) if not done[row]]
        if not keep:
            break
        if len(live) - len(keep) >= max(1, len(live) // 4):  # drop the finished rows
            sel = torch.tensor(keep, device=device)
            cache.batch_select_indices(sel)
            mask, pos, nxt = mask[sel], pos[sel], nxt[torch.tensor(keep)]
            live = [live[s] for s in keep]
        mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
        pos = pos + 1
        step = Rows(cache, nxt.view(-1, 1).to(device), mask, pos)
        result = forward(model, step, cache_arg, last_logits)
    return out


def _sample(lp: Tensor, gens: list[torch.Generator]) -> Tensor:
    """(b,) one draw per row from exp(lp) by inverse CDF: one uniform from each row's own
    generator (its draws depend on nothing else in the batch), one cumsum and one search for
    the whole batch, instead of a multinomial call per row (a millisecond each at 49k)."""
    u = torch.cat([torch.rand(1, generator=g) for g in gens])  # (b,)
    cdf = lp.exp().cumsum(-1)  # (b, V)
    picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).squeeze(-1)  # (b,)
    return picked.clamp(max=lp.shape[-1] - 1)
