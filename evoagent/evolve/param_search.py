"""Numeric and categorical parameter search with optuna's TPE (Bergstra et al. 2011).

The study is rebuilt from the archive each time: every archived agent with the parent's
structure (same nodes, kinds and edges) is a finished trial, its val score the objective. TPE
then proposes the next parameters. No optuna state is kept outside the archive, so ``--resume``
and reruns see the same trials and, with the seeded sampler, propose the same child.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from evoagent.errors import MutationError
from evoagent.evolve.operators import MutationContext, mutation
from evoagent.graph.model import AgentGraph, LLMNode, LoopNode, VoteNode

MAX_TOKENS = (32, 64, 128, 256)
SAMPLES = (1, 3, 5)


def structure(graph: AgentGraph) -> tuple:
    """What param search holds fixed: node ids and kinds, edges, entry and exit."""
    return (
        tuple(sorted((n.id, n.kind) for n in graph.nodes)),
        tuple(sorted((e.src, e.dst) for e in graph.edges)),
        graph.entry,
        graph.exit,
    )


def space(graph: AgentGraph) -> dict[str, BaseDistribution]:
    """The searchable parameters of ``graph`` as ``"node.field"`` -> distribution."""
    voters = {e.src for e in graph.edges if isinstance(graph.node(e.dst), VoteNode)}
    out: dict[str, BaseDistribution] = {}
    for n in graph.nodes:
        if isinstance(n, LLMNode | LoopNode):
            out[f"{n.id}.temperature"] = FloatDistribution(0.0, 1.2)
            out[f"{n.id}.max_tokens"] = CategoricalDistribution(MAX_TOKENS)
        if isinstance(n, LLMNode) and n.id in voters:
            out[f"{n.id}.samples"] = CategoricalDistribution(SAMPLES)
        if isinstance(n, LoopNode):
            out[f"{n.id}.max_turns"] = IntDistribution(1, 8)
    return out


def params(graph: AgentGraph, dists: dict[str, BaseDistribution]) -> dict[str, Any]:
    return {k: getattr(graph.node(k.split(".")[0]), k.split(".")[1]) for k in dists}


def apply(graph: AgentGraph, values: dict[str, Any]) -> AgentGraph:
    for key, value in values.items():
        node_id, fld = key.split(".")
        node = graph.node(node_id)
        graph = graph.replace_node(node.model_copy(update={fld: value}))
    return graph


@mutation("param_search")
def param_search(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Ask TPE for new sampling parameters given every archived trial of this structure."""
    graph = parents[0]
    dists = space(graph)
    if not dists:
        raise MutationError("param_search: the graph has no tunable llm or loop node")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=ctx.rng.getrandbits(31), n_startup_trials=4)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    shape = structure(graph)
    for g, score in ctx.history():
        if structure(g) != shape:
            continue
        values = params(g, dists)
        if all(_inside(values[k], d) for k, d in dists.items()):
            study.add_trial(optuna.trial.create_trial(params=values, distributions=dists, value=score))
    trial = study.ask(dists)
    values = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in trial.params.items()}
    child = apply(graph, values)
    if child.id == graph.id:
        raise MutationError("param_search: TPE proposed the parent's own parameters")
    return child


def _inside(value: Any, dist: BaseDistribution) -> bool:
    """Whether an archived value is a legal point of ``dist`` (older agents may lie outside)."""
    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    assert isinstance(dist, FloatDistribution | IntDistribution)
    return dist.low <= value <= dist.high
