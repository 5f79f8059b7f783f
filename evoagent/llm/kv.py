"""KV caches for the hf backend: preallocated per-layer buffers, rows that start from different
cached prefixes, and a byte-bounded store of prefix KV keyed by token ids.

transformers' ``DynamicLayer`` grows by ``torch.cat`` at every decoded token, so a decode of T
tokens over a batch with L cached positions copies the whole cache T times. ``BufferLayer``
writes into a buffer sized once for the whole decode instead.

Prefix reuse (the system prompt and demos that every input of an agent repeats, the G samples
of one RL group, the turns of one ``loop`` episode) rests on one layout. Each row of a batch is
``[pad][cached prefix][pad][new ids]``: the cached prefixes are right-aligned in the first C
columns and the new ids right-aligned in the next N, so every row's last prompt token sits in
the last column. The attention mask zeroes the pads and the position ids count only real
tokens, so a row computes exactly what it would alone (up to the rounding of its batch shape,
see ``evoagent.llm.hf``). Keys already carry their rotary positions, and a prefix keeps the
positions 0..c-1 it was computed with, so cached KV can be placed in any row.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers.cache_utils import DynamicCache, DynamicLayer

KV = tuple[tuple[Tensor, Tensor], ...]  # per layer (keys, values), each (H, L, D)
INDEX = 32  # entries are found by their first INDEX tokens; shorter prefixes are not stored


class BufferLayer(DynamicLayer):
    """A cache layer over a preallocated (B, H, capacity, D) buffer: ``update`` writes in place
    and ``keys``/``values`` are views of the filled part."""

    def __init__(self, keys: Tensor, values: Tensor, length: int) -> None:
        super().__init__()
        self._k, self._v, self.length = keys, values, length
        self.device, self.is_initialized = keys.device, True
        self._view()

    def _view(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        n = key_states.shape[-2]
        if self.length + n > self._k.shape[2]:  # the caller's capacity was short: grow once
            grow = max(n, self._k.shape[2])
            self._k = torch.cat([self._k, self._k.new_zeros(*self._k.shape[:2], grow, self._k.shape[3])], 2)
            self._v = torch.cat([self._v, self._v.new_zeros(*self._v.shape[:2], grow, self._v.shape[3])], 2)
        self._k[:, :, self.length : self.length + n] = key_states
        self._v[:, :, self.length : self.length + n] = value_states
        self.length += n
        self._view()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: Tensor) -> None:
        self._k, self._v = self._k[indices], self._v[indices]
        self._view()


@dataclass(frozen=True)
class Rows:
    """A batch in the prefix layout: ``C`` cached columns, then ``N`` columns of new ids.

    Attributes:
        cache: the model cache holding the C cached columns (capacity for the rest).
        input_ids: (B, N) the new ids, right-aligned, pad on the left.
        attention_mask: (B, C + N) 1 on real tokens.
        position_ids: (B, N) each new id's position in its own row.
    """

    cache: DynamicCache | None
    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor


def layout(
    prefixes: Sequence[KV | None], new: Sequence[Sequence[int]], pad_id: int, extra: int,
    device: torch.device,
) -> Rows:
    """Place each row's cached prefix (or none) and its new ids (at least one) in one batch,
    with room for ``extra`` more columns (the tokens to decode)."""
    b = len(new)
    lens = [0 if p is None else p[0][0].shape[1] for p in prefixes]
    c, n = max(lens), max(len(x) for x in new)
    ids = torch.full((b, n), pad_id, dtype=torch.long)
    mask = torch.zeros((b, c + n), dtype=torch.long)
    pos = torch.zeros((b, n), dtype=torch.long)
    for i, (cached, x) in enumerate(zip(lens, new, strict=True)):
        ids[i, n - len(x) :] = torch.tensor(list(x), dtype=torch.long)
        mask[i, c - cached : c] = 1
        mask[i, c + n - len(x) :] = 1
        pos[i, n - len(x) :] = torch.arange(cached, cached + len(x))
    cache = None
    if c > 0:
        template = next(p for p in prefixes if p is not None)
        layers = []
        for li, (k0, v0) in enumerate(template):
            k = k0.new_zeros(b, k0.shape[0], c + n + extra, k0.shape[2])
            v = v0.new_zeros(b, v0.shape[0], c + n + extra, v0.shape[2])
            for i, p in enumerate(prefixes):
                if p is not None:
                    k[i, :, c - lens[i] : c] = p[li][0]
                    v[i, :, c - lens[i] : c] = p[li][1]
            layers.append(BufferLayer(k, v, c))
        cache = DynamicCache()
        cache.layers = layers
    return Rows(cache, ids.to(device), mask.to(device), pos.to(device))


def fresh_cache(model_cache: DynamicCache, capacity: int) -> DynamicCache:
    """Move a cache that transformers built by concatenation into buffers with ``capacity``
    columns, so the decode that follows writes in place."""
    layers = []
    for layer in model_cache.layers:
        k, v = layer.keys, layer.values
        bk = k.new_zeros(*k.shape[:2], max(capacity, k.shape[2]), k.shape[3])
        bv = v.new_zeros(*v.shape[:2], max(capacity, v.shape[2]), v.shape[3])
        bk[:, :, : k.shape[2]] = k
        bv[:, :, : v.shape[2]] = v
        layers.append(BufferLayer(bk, bv, k.shape[2]))
    cache = DynamicCache()
    cache.layers = layers
    return cache


def row_kv(cache: DynamicCache, row: int, columns: Tensor) -> KV:
    """The KV of one row at ``columns`` (its real tokens, in order), as a standalone prefix."""
    return tuple(
        (layer.keys[row, :, columns], layer.values[row, :, columns])
        for layer in cache.layers
    )


def kv_bytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


@dataclass
class _Entry:
    kv: KV
    once: bool  # a loop turn's KV: the next turn extends it, nobody else will


class PrefixStore:
    """An LRU map from token-id prefixes to their KV, bounded in bytes.

    ``longest(ids)`` finds the longest stored prefix of ``ids``. Entries put with ``once``
    (an episode's turn, which only its next turn extends) are removed when found. The store
    belongs to one set of weights: the backend clears it when they change.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._data: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._index: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
        self.bytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._data)

    def longest(self, ids: Sequence[int], limit: int, consume: bool = True) -> tuple[int, KV | None]:
        """(length, KV) of the longest stored prefix of ``ids[:limit]``; (0, None) if none.
        A ``once`` entry found is removed unless ``consume`` is false."""
        if limit < INDEX:
            return 0, None
        head = tuple(ids[:INDEX])
        best: tuple[int, ...] | None = None
        for key in self._index.get(head, ()):
            if len(key) <= limit and (best is None or len(key) > len(best)) and tuple(ids[: len(key)]) == key:
                best = key
        if best is None:
            return 0, None
        entry = self._data[best]
        if entry.once and consume:
            self._drop(best)
        else:
            self._data.move_to_end(best)
        self.hits += 1
        self.reused_tokens += len(best)
        return len(best), entry.kv

    def put(self, ids: Sequence[int], kv: KV, once: bool = False) -> None:
        """Keep ``kv`` as the KV of ``ids`` (too short or too large to keep: ignored)."""
        key = tuple(ids)
        size = kv_bytes(kv)
        if len(key) < INDEX or size > self.max_bytes:
            return
        if key in self._data:
            self._drop(key)
        self._data[key] = _Entry(kv, once)
        self._index.setdefault(key[:INDEX], set()).add(key)
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._data)))

    def clear(self) -> None:
        self._data.clear()
        self._index.clear()
        self.bytes = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        entry = self._data.pop(key)
        self.bytes -= kv_bytes(entry.kv)
        bucket = self._index[key[:INDEX]]
        bucket.discard(key)
        if not bucket:
            del self._index[key[:INDEX]]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
