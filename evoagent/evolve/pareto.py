"""GEPA's per-input Pareto front as a parent-selection strategy (``selection.kind: pareto``).

An agent with a lower mean can still be the only one that solves some inputs; selecting by the
mean alone drops what it knows. GEPA keeps, for each val input, the agents that score best on
it; an agent on no input's front, or whose inputs are a strict subset of another front agent's,
is dominated. A parent is drawn from the rest with probability proportional to the number of
inputs it leads on. Inputs that no agent solves at all (best reward 0) lead nobody; when no
input has a leader the draw falls back to the best mean score.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from evoagent.evolve.pool import Candidate, Pool, selector, with_others
from evoagent.spec.config import SelectionConfig


def front(pool: Pool) -> dict[str, frozenset[str]]:
    """{agent id: the inputs it leads on} for the agents on the front, dominated ones removed."""
    scores: Mapping[str, Mapping[str, float]] = pool.instances()
    best: dict[str, float] = {}
    for c in pool.candidates:
        for inp, r in scores.get(c.id, {}).items():
            best[inp] = max(best.get(inp, 0.0), r)
    leads = {c.id: frozenset(i for i, r in scores.get(c.id, {}).items() if best[i] > 0 and r >= best[i])
             for c in pool.candidates}
    leads = {a: s for a, s in leads.items() if s}
    return {a: s for a, s in leads.items() if not any(s < t for b, t in leads.items() if b != a)}


@selector("pareto")
def pareto(
    pool: Pool, n: int, slot: int, generation: int, rng: random.Random, cfg: SelectionConfig,
) -> tuple[list[Candidate], int]:
    """Draw a front agent by how many inputs it leads on; further parents from the front too."""
    leaders = front(pool)
    by_id = {c.id: c for c in pool.candidates}
    if not leaders:
        first = pool.best()
    else:
        ids = sorted(leaders)
        first = by_id[rng.choices(ids, weights=[len(leaders[i]) for i in ids], k=1)[0]]
    on_front = {by_id[i].score for i in leaders}

    def weight(score: float, children: int) -> float:
        return 1.0 if score in on_front else 0.0  # partners come from the front's score levels

    return with_others(pool, first, n, weight, rng), first.island
