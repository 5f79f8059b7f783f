"""The parent-selection strategies: FunSearch islands and Darwin Gödel Machine archive sampling
here; GEPA's per-input Pareto front (``pareto.py``) and MAP-Elites (``map_elites.py``) beside,
all registered on the pool's selector registry (``pool.py``), which ``get_selector`` reads.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from evoagent.evolve.pool import REGISTRY, Candidate, Pool, Selector, selector, with_others
from evoagent.spec.config import SelectionConfig


def _load_builtins() -> None:
    from evoagent.evolve import map_elites, pareto  # noqa: F401  (each registers its strategy)


SELECTORS = REGISTRY.loading(_load_builtins)
known_selectors = SELECTORS.names
get_selector: Callable[[str], Selector] = SELECTORS.get  # an unknown name lists the known ones


@selector("islands")
def islands(
    pool: Pool, n: int, slot: int, generation: int, rng: random.Random, cfg: SelectionConfig,
) -> tuple[list[Candidate], int]:
    """FunSearch islands: child ``slot`` evolves island ``slot % islands`` by Boltzmann choice.

    Every ``migrate_every`` generations the weakest island draws from the global best instead
    (FunSearch resets its worst islands with the best programs of others).
    """
    island = slot % cfg.islands
    scope = island if pool.groups(island) else None  # an empty island draws from everyone
    top = pool.top(scope)

    def weight(score: float, children: int) -> float:
        return math.exp((score - top) / cfg.temperature)

    weakest = min(range(cfg.islands), key=lambda i: (pool.top(i), i))
    if generation % cfg.migrate_every == 0 and cfg.islands > 1 and island == weakest:
        first = pool.best()
    else:
        first = pool.draw(scope, weight, rng)  # type: ignore[assignment]
    return with_others(pool, first, n, weight, rng), island


@selector("dgm")
def dgm(
    pool: Pool, n: int, slot: int, generation: int, rng: random.Random, cfg: SelectionConfig,
) -> tuple[list[Candidate], int]:
    """Darwin Gödel Machine: p ∝ sigmoid(λ(score - median)) / (1 + children); open-ended."""
    median = pool.median()

    def weight(score: float, children: int) -> float:
        return 1 / (1 + math.exp(-10 * (score - median))) / (1 + children)

    first = pool.draw(None, weight, rng)
    assert first is not None  # the loop never selects from an empty pool
    return with_others(pool, first, n, weight, rng), first.island
