"""Memoise completions by (weights version, request): the same prompt, sampling params and seed
under the same weights always yields the same tokens, so re-evaluating an unchanged node is free.

The key includes ``weights_version``: after an RL step every entry is stale by construction and
simply stops matching. The cache is bounded (least recently used entries go first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from evoagent.llm.types import Generation, GenerationRequest, Usage


class GenerationCache:
    """An LRU map from ``(weights_version, request)`` to its ``Generation``."""

    def __init__(self, max_entries: int = 50_000) -> None:
        self._data: OrderedDict[tuple, Generation] = OrderedDict()
        self._max = max_entries
        self.hits = 0
        self.misses = 0

    def get(self, version: int, request: GenerationRequest) -> Generation | None:
        """The cached generation marked ``cached=True``, or None."""
        key = _key(version, request)
        found = self._data.get(key)
        if found is None:
            self.misses += 1
            return None
        self._data.move_to_end(key)
        self.hits += 1
        return replace(found, cached=True)

    def put(self, version: int, request: GenerationRequest, generation: Generation) -> None:
        key = _key(version, request)
        self._data[key] = generation
        self._data.move_to_end(key)
        while len(self._data) > self._max:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        """Forget every entry (the weights they were sampled from changed)."""
        self._data.clear()


def _key(version: int, r: GenerationRequest) -> tuple:
    """A hashable key: messages are dicts, so they enter as (role, content) pairs."""
    msgs = tuple((m["role"], m["content"]) for m in r.messages)
    return (version, msgs, r.max_tokens, r.temperature, r.seed, r.stop, r.prefix_ids, r.adapter)


Fetch = Callable[[list[GenerationRequest]], Awaitable[list[Generation]]]


async def through_cache(
    cache: GenerationCache | None, version: int, requests: Sequence[GenerationRequest], fetch: Fetch,
    usage: Usage,
) -> list[Generation]:
    """Answer ``requests`` from ``cache`` where it can, the rest with one ``fetch`` call, and
    keep what ``fetch`` returns under ``version`` (unless the weights changed meanwhile).
    ``usage`` counts what ``fetch`` generated, and every request."""
    usage.requests += len(requests)
    out: list[Generation | None] = [
        cache.get(version, r) if cache is not None else None for r in requests
    ]
    todo = [i for i, g in enumerate(out) if g is None]
    if todo:
        fresh = await fetch([requests[i] for i in todo])
        usage.add(fresh)
        for i, g in zip(todo, fresh, strict=True):
            out[i] = g
            if cache is not None and g.weights_version == version:
                cache.put(version, requests[i], g)
    return [g for g in out if g is not None]
