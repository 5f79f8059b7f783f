"""GPTSwarm's edge optimization as an operator (``learn_edges``): which connections of an agent
help, learned by trying sub-graphs.

An edge with a probability ``p`` (``Edge.p``) is kept in each execution with that probability
(the executor blanks a dropped edge's source). ``learn_edges`` treats the probabilistic edges
of the parent as independent Bernoulli choices with logits ``theta`` and runs REINFORCE with a
mean baseline (GPTSwarm, Zhuge et al. 2024): each of ``iterations`` samples ``samples``
sub-graphs (every edge kept or dropped), scores each on ``inputs`` train inputs with the policy
(``ctx.evaluate``), and moves ``theta`` by ``lr x (reward - baseline) x (kept - p)``. The child
is the parent pruned to its likely edges: an edge whose learned ``p`` reaches ``keep`` becomes
a plain edge, one below is removed with the placeholders that read it (left blank) and any
node no longer leading to the exit. When removal would leave no valid graph, the edge keeps
its learned ``p``. The five are the operator's settings (``EdgeSettings``), set in task.yaml::

    evolve:
      operators: [{name: learn_edges, params: {iterations: 8, lr: 2.0}}]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field

from evoagent.errors import GraphError, MutationError
from evoagent.evolve.operators import MutationContext, mutation
from evoagent.graph.model import AgentGraph, Edge, VoteNode
from evoagent.graph.validate import validate
from evoagent.spec.config import RunSpec
from evoagent.tools import known_tools


class EdgeSettings(BaseModel):
    """``learn_edges``' settings; each child costs iterations x samples x inputs executions."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    iterations: int = Field(4, ge=1, description="REINFORCE updates of the edge logits")
    samples: int = Field(4, ge=2, description="sub-graphs sampled per iteration (the baseline is their mean)")
    inputs: int = Field(4, ge=1, description="train inputs each sub-graph is scored on")
    lr: float = Field(4.0, gt=0, description="step size on the logits")
    keep: float = Field(0.5, gt=0, lt=1, description="learned probability at which an edge is kept as a plain edge")


def probabilistic(graph: AgentGraph) -> list[Edge]:
    return [e for e in graph.edges if e.p is not None]


def with_mask(graph: AgentGraph, kept: dict[tuple[str, str], bool]) -> AgentGraph:
    """``graph`` with each probabilistic edge made certain: kept (p None) or dropped (p 0)."""
    return graph.model_copy(update={"edges": tuple(
        e if e.p is None else e.model_copy(update={"p": None if kept[(e.src, e.dst)] else 0.0})
        for e in graph.edges)})


def pruned(graph: AgentGraph, probs: dict[tuple[str, str], float], tools: Sequence[str],
           keep: float = EdgeSettings().keep) -> AgentGraph:
    """Likely edges made plain, unlikely ones removed (see the module docstring)."""
    edges = []
    for e in graph.edges:
        p = probs.get((e.src, e.dst))
        edges.append(e if p is None else e.model_copy(update={"p": None if p >= keep else round(p, 3)}))
    child = graph.model_copy(update={"edges": tuple(edges)})
    for e in sorted((e for e in edges if e.p is not None), key=lambda e: e.p or 0.0):
        try:
            child = validate(_without(child, e), tools)
        except GraphError:
            continue  # the edge stays, with its learned p
    return child


def _without(graph: AgentGraph, edge: Edge) -> AgentGraph:
    """``graph`` minus ``edge``: the destination's ``{src}`` placeholder blanked, nodes that no
    longer lead to the exit removed."""
    edges = [e for e in graph.edges if (e.src, e.dst) != (edge.src, edge.dst)]
    nodes = [n if n.id != edge.dst or isinstance(n, VoteNode)
             else n.model_copy(update={"template": n.template.replace("{" + edge.src + "}", "")})
             for n in graph.nodes]
    g = graph.model_copy(update={"nodes": tuple(nodes), "edges": tuple(edges)}).digraph()
    alive = nx.ancestors(g, graph.exit) | {graph.exit}
    if graph.entry not in alive:
        raise GraphError("pruning would cut the entry from the exit")
    return graph.model_copy(update={
        "nodes": tuple(n for n in nodes if n.id in alive),
        "edges": tuple(e for e in edges if e.src in alive and e.dst in alive),
    })


def needs_edges(seeds: Sequence[AgentGraph], spec: RunSpec) -> str | None:
    """Spec check: some seed graph has a probabilistic edge, and there are inputs to try on."""
    if not any(probabilistic(g) for g in seeds):
        return "learn_edges learns edge probabilities, and no seed graph has an edge with p (Edge.p)"
    if spec.task.splits.train == 0:
        return "learn_edges tries sub-graphs on train inputs, and task.splits.train is 0"
    return None


@mutation("learn_edges", check=needs_edges, settings=EdgeSettings)
async def learn_edges(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Learn the parent's edge probabilities by REINFORCE on train inputs, then prune."""
    cfg: EdgeSettings = ctx.settings or EdgeSettings()
    graph = parents[0]
    edges = [(e.src, e.dst) for e in probabilistic(graph)]
    if not edges:
        raise MutationError("learn_edges: the parent has no edge with a probability (Edge.p) to learn")
    theta = {k: _logit(e.p) for k, e in zip(edges, probabilistic(graph), strict=True)}
    for _ in range(cfg.iterations):
        probs = {k: _sigmoid(t) for k, t in theta.items()}
        masks = [{k: ctx.rng.random() < probs[k] for k in edges} for _ in range(cfg.samples)]
        rewards = []
        for m in masks:
            scores = await ctx.evaluate(with_mask(graph, m), cfg.inputs)
            rewards.append(sum(scores) / max(1, len(scores)))
        baseline = sum(rewards) / len(rewards)
        for k in edges:
            grad = sum((r - baseline) * (float(m[k]) - probs[k]) for r, m in zip(rewards, masks, strict=True))
            theta[k] += cfg.lr * grad / cfg.samples
    tools = sorted(set(known_tools()) | set(ctx.tools))
    child = pruned(graph, {k: _sigmoid(t) for k, t in theta.items()}, tools, cfg.keep)
    if child.id == graph.id:
        raise MutationError("learn_edges: the learned probabilities left the graph as it was")
    return child


def _logit(p: float | None) -> float:
    p = min(max(p if p is not None else 0.5, 1e-3), 1 - 1e-3)
    return math.log(p / (1 - p))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))
