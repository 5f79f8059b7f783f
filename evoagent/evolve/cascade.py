"""Cascade evaluation: score a child on a small val minibatch first and spend the full val split
only on children that clear the bar (AlphaEvolve / OpenEvolve's evaluation cascade).

The minibatch is the first ``minibatch`` val examples, fixed for the whole run, so minibatch
scores are comparable across children; the full stage reuses the minibatch trajectories and
runs only the remaining examples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from evoagent.execute.evaluate import Evaluation, Evaluator
from evoagent.graph.model import AgentGraph
from evoagent.spec.config import CascadeConfig
from evoagent.tasks.datasets import Example


@dataclass
class CascadeResult:
    minibatch: Evaluation
    full: Evaluation | None  # None: the child did not clear the minibatch bar


async def cascade(
    graph: AgentGraph,
    val: Sequence[Example],
    evaluator: Evaluator,
    cfg: CascadeConfig,
    on_done: Callable[[], None] | None = None,
) -> CascadeResult:
    """Minibatch stage, then (if ``score > threshold``) the rest of val merged into ``full``."""
    m = min(cfg.minibatch, len(val))
    first = await evaluator.evaluate(graph, val[:m], on_done)
    if first.score <= cfg.threshold and m < len(val):
        return CascadeResult(first, None)
    if m == len(val):
        return CascadeResult(first, first)
    rest = await evaluator.evaluate(graph, val[m:], on_done)
    full = Evaluation.of(first.trajectories + rest.trajectories, rest.weights_version,
                         first.seconds + rest.seconds)
    return CascadeResult(first, full)
