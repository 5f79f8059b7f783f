"""What parents are drawn from: the ``Pool`` of valid archived agents (``Candidate``), the
selector extension point (``Selector``, ``@selector``) and the helper every strategy shares.

A selector is ``fn(pool, n, slot, generation, rng, cfg) -> (parents, island)``: pick ``n``
parents for the child in ``slot`` of this generation and name the island the child joins. The
pool is rebuilt from the archive every generation (one SQL query), so selection carries no
state of its own; a ``Pool`` draw costs O(distinct score levels), so it stays in milliseconds
at 100,000 agents (``bench/archive_scale.py``). What only some strategies need (each agent's
per-input rewards, its behaviour descriptors) the pool reads from the archive on first use.
The strategies themselves register from ``selection.py``, ``pareto.py`` and ``map_elites.py``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from evoagent.errors import SpecError
from evoagent.registry import Registry
from evoagent.spec.config import SelectionConfig


@dataclass(frozen=True)
class Candidate:
    """A valid archived agent with its latest val score and the weights version it was scored
    under (no graph: the loop loads graphs only for the parents drawn). A score from an older
    version than the run's is stale: the loop re-scores such an agent when it is drawn."""

    id: str
    score: float
    island: int
    children: int
    generation: int
    version: int = 0


Weight = Callable[[float, int], float]  # (score, children) -> unnormalised draw weight


class Pool:
    """The candidates parents are drawn from, grouped so that a draw costs O(levels), not O(N).

    Both built-in strategies weigh a candidate by its (score, number of children) only, and a
    val score is a mean over a few dozen inputs, so a pool of 100,000 agents holds a few
    hundred distinct levels: a draw picks a level by weight x size, then a member uniformly,
    which is exactly the per-candidate weighted draw. Groupings are cached per island.
    """

    def __init__(
        self, candidates: Sequence[Candidate],
        instances: Callable[[], Mapping[str, Mapping[str, float]]] | None = None,
        measure: Callable[[str, Sequence[str]], Mapping[str, float]] | None = None,
    ) -> None:
        self.candidates = sorted(candidates, key=lambda c: c.id)
        self._instances_source = instances
        self._instances: Mapping[str, Mapping[str, float]] | None = None
        self._measure_source = measure
        self._measures: dict[str, Mapping[str, float]] = {}
        groups: dict[int | None, dict[tuple[float, int], list[Candidate]]] = {None: {}}
        for c in self.candidates:  # one pass: the whole pool and each island
            key = (c.score, c.children)
            groups[None].setdefault(key, []).append(c)
            groups.setdefault(c.island, {}).setdefault(key, []).append(c)
        self._groups = {i: dict(sorted(g.items())) for i, g in groups.items()}
        self._best = max(self.candidates, key=lambda c: (c.score, -c.generation), default=None)

    def __len__(self) -> int:
        return len(self.candidates)

    def instances(self) -> Mapping[str, Mapping[str, float]]:
        """{agent id: {val input id: reward}}, read once (an empty mapping without a source)."""
        if self._instances is None:
            self._instances = self._instances_source() if self._instances_source else {}
        return self._instances

    def measure(self, name: str) -> Mapping[str, float]:
        """{agent id: value} of descriptor ``name``, read once (agents it cannot measure are left out)."""
        if name not in self._measures:
            ids = [c.id for c in self.candidates]
            self._measures[name] = self._measure_source(name, ids) if self._measure_source else {}
        return self._measures[name]

    def groups(self, island: int | None) -> dict[tuple[float, int], list[Candidate]]:
        """(score, children) -> members, of one island (None: the whole pool)."""
        return self._groups.get(island, {})

    def draw(self, island: int | None, weight: Weight, rng: random.Random,
             exclude: frozenset[str] = frozenset()) -> Candidate | None:
        """One candidate with probability proportional to ``weight``; None if none is left."""
        levels = [(key, [c for c in members if c.id not in exclude] if exclude else members)
                  for key, members in self.groups(island).items()]
        levels = [(key, members) for key, members in levels if members]
        if not levels:
            return None
        weights = [weight(*key) * len(members) for key, members in levels]
        if sum(weights) <= 0:
            weights = [float(len(members)) for _, members in levels]
        _, members = rng.choices(levels, weights=weights, k=1)[0]
        return rng.choice(members)

    def top(self, island: int | None = None) -> float:
        """The best score of an island (or of the pool); -1 for an empty island."""
        return max((key[0] for key in self.groups(island)), default=-1.0)

    def best(self) -> Candidate:
        """The best candidate, the oldest first among equals (FunSearch's migration source)."""
        if self._best is None:
            raise ValueError("an empty pool has no best candidate")
        return self._best

    def median(self) -> float:
        """The median score, counted over levels."""
        counts = [(key[0], len(m)) for key, m in self.groups(None).items()]
        counts.sort()
        half, seen = len(self.candidates) // 2, 0
        for score, n in counts:
            seen += n
            if seen > half:
                return score
        return counts[-1][0]


Selector = Callable[[Pool, int, int, int, random.Random, SelectionConfig], tuple[list[Candidate], int]]
REGISTRY: Registry[Selector] = Registry("selector", SpecError, field="evolve.selection.kind")
selector = REGISTRY.register  # ``@selector("name")``: register a parent-selection strategy


def with_others(pool: Pool, first: Candidate, n: int, weight: Weight, rng: random.Random) -> list[Candidate]:
    """``first`` plus ``n - 1`` distinct further parents drawn from the whole pool."""
    chosen = [first]
    while len(chosen) < n:
        c = pool.draw(None, weight, rng, exclude=frozenset(p.id for p in chosen))
        if c is None:
            break
        chosen.append(c)
    return chosen
