"""MAP-Elites as a parent-selection strategy (``selection.kind: map_elites``).

The archive is cut into a grid over declared behaviour descriptors (``evolve.selection.
descriptors``: each a measured property, e.g. nodes or LLM calls per input, with bin edges;
``evolve/descriptors.py``). Each cell keeps its elite, the best-scoring agent that falls in
it; a parent is the elite of a cell drawn uniformly among the occupied ones. A small cheap
agent and a large thorough one both stay parents, where selection by score alone would keep
breeding from the single best shape. The grid is derived from the archive every generation.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence

from evoagent.evolve.pool import Candidate, Pool, selector, with_others
from evoagent.spec.config import DescriptorConfig, SelectionConfig

Cell = tuple[int, ...]


def grid(pool: Pool, axes: Sequence[DescriptorConfig]) -> dict[Cell, list[Candidate]]:
    """{cell: its agents, the elite first (best score, then the oldest)}; an agent some
    descriptor cannot measure (no val execution yet) is in no cell."""
    measures = [pool.measure(a.name) for a in axes]
    cells: dict[Cell, list[Candidate]] = {}
    for c in pool.candidates:
        if all(c.id in m for m in measures):
            cell = tuple(bisect.bisect_right(a.bins, m[c.id]) for a, m in zip(axes, measures, strict=True))
            cells.setdefault(cell, []).append(c)
    for members in cells.values():
        members.sort(key=lambda c: (-c.score, c.generation, c.id))
    return dict(sorted(cells.items()))


@selector("map_elites")
def map_elites(
    pool: Pool, n: int, slot: int, generation: int, rng: random.Random, cfg: SelectionConfig,
) -> tuple[list[Candidate], int]:
    """The elite of a uniformly drawn occupied cell; further parents are other cells' elites."""
    cells = grid(pool, cfg.descriptors)
    if not cells:
        first = pool.best()
        return with_others(pool, first, n, lambda s, k: 1.0, rng), first.island
    keys = list(cells)
    order = rng.sample(keys, len(keys))
    parents = [cells[k][0] for k in order[:n]]
    return parents, keys.index(order[0])
