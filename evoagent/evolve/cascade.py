"""Cascade evaluation: score a child on a small minibatch first and spend the full val split
only on children that clear the bar (AlphaEvolve / OpenEvolve's evaluation cascade).

With ``first_stage: val`` the minibatch is the first ``minibatch`` val examples, fixed for the
whole run, so minibatch scores are comparable across children; the full stage reuses the
minibatch trajectories and runs only the remaining examples. With ``first_stage: train`` the
loop passes ``screen``, train examples drawn for the generation: the full stage then runs every
val example, and the screen's episodes are on inputs the RL phase may train on
(``rl.reuse_search``).
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
    screen: Sequence[Example] = (),
) -> CascadeResult:
    """Minibatch stage, then (if ``score > threshold``) the rest of val merged into ``full``;
    with a ``screen``, the minibatch stage runs on it and the full stage on all of val."""
    if screen:
        first = await evaluator.evaluate(graph, screen, on_done)
        if first.score <= cfg.threshold:
            return CascadeResult(first, None)
        return CascadeResult(first, await evaluator.evaluate(graph, val, on_done))
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
