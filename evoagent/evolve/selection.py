"""Parent selection strategies: FunSearch islands and Darwin Gödel Machine archive sampling.

A selector is ``fn(pool, n, slot, generation, rng, cfg) -> (parents, island)``: pick ``n``
parents for the child in ``slot`` of this generation and name the island the child joins. The
pool is rebuilt from the archive every generation, so selection carries no state of its own.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from evoagent.errors import SpecError
from evoagent.registry import Registry
from evoagent.graph.model import AgentGraph
from evoagent.spec.config import SelectionConfig


@dataclass(frozen=True)
class Candidate:
    """A valid archived agent with its val score under the current weights."""

    id: str
    graph: AgentGraph
    score: float
    island: int
    children: int
    generation: int


Selector = Callable[
    [Sequence[Candidate], int, int, int, random.Random, SelectionConfig], tuple[list[Candidate], int]
]
_REGISTRY: Registry[Selector] = Registry("selector", SpecError, field="evolve.selection.kind")
selector = _REGISTRY.register  # ``@selector("name")``: register a parent-selection strategy
known_selectors = _REGISTRY.names
get_selector = _REGISTRY.get


def _softmax_pick(pool: Sequence[Candidate], weights: Sequence[float], rng: random.Random) -> Candidate:
    return rng.choices(list(pool), weights=list(weights), k=1)[0]


def _boltzmann(pool: Sequence[Candidate], temperature: float) -> list[float]:
    top = max(c.score for c in pool)
    return [math.exp((c.score - top) / temperature) for c in pool]


def _others(pool: Sequence[Candidate], first: Candidate, n: int, rng: random.Random,
            weights: Callable[[Sequence[Candidate]], list[float]]) -> list[Candidate]:
    """``first`` plus ``n - 1`` distinct further parents drawn from the rest of the pool."""
    chosen = [first]
    rest = [c for c in pool if c.id != first.id]
    while len(chosen) < n and rest:
        c = _softmax_pick(rest, weights(rest), rng)
        chosen.append(c)
        rest = [r for r in rest if r.id != c.id]
    return chosen


@selector("islands")
def islands(
    pool: Sequence[Candidate], n: int, slot: int, generation: int, rng: random.Random,
    cfg: SelectionConfig,
) -> tuple[list[Candidate], int]:
    """FunSearch islands: child ``slot`` evolves island ``slot % islands`` by Boltzmann choice.

    Every ``migrate_every`` generations the weakest island draws from the global best instead
    (FunSearch resets its worst islands with the best programs of others).
    """
    island = slot % cfg.islands
    members = [c for c in pool if c.island == island] or list(pool)
    if generation % cfg.migrate_every == 0 and cfg.islands > 1:
        best = {i: max((c.score for c in pool if c.island == i), default=-1.0) for i in range(cfg.islands)}
        if island == min(best, key=lambda i: (best[i], i)):
            members = [max(pool, key=lambda c: (c.score, -c.generation))]
    weights = lambda cs: _boltzmann(cs, cfg.temperature)  # noqa: E731
    first = _softmax_pick(members, weights(members), rng)
    return _others(pool, first, n, rng, weights), island


@selector("dgm")
def dgm(
    pool: Sequence[Candidate], n: int, slot: int, generation: int, rng: random.Random,
    cfg: SelectionConfig,
) -> tuple[list[Candidate], int]:
    """Darwin Gödel Machine: p ∝ sigmoid(λ(score - median)) / (1 + children); open-ended."""
    scores = sorted(c.score for c in pool)
    median = scores[len(scores) // 2]

    def weights(cs: Sequence[Candidate]) -> list[float]:
        return [1 / (1 + math.exp(-10 * (c.score - median))) / (1 + c.children) for c in cs]

    first = _softmax_pick(pool, weights(pool), rng)
    return _others(pool, first, n, rng, weights), first.island
