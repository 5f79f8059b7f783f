"""Operators that spend test-time compute where the current ones cannot reach: plan first
(decomposition), sample several answers and vote (best-of-N, self-consistency), reflect on an
attempt and try once more (Reflexion).

In the README's main job every agent failed every two-step word problem: a calculator fixes the
arithmetic and demos fix the format, but nothing made the model lay out the two steps. These
add that structure. Each returns a new graph or raises ``MutationError`` when it does not apply.
"""

from __future__ import annotations

from collections.abc import Sequence

from evoagent.errors import MutationError
from evoagent.evolve.operators import MutationContext, mutation
from evoagent.evolve.structure_ops import fresh_id, insert_after
from evoagent.graph.model import AgentGraph, Edge, LLMNode, VoteNode

PLAN_SYSTEM = ("Break the problem into short numbered steps, one calculation or fact per step. "
               "Do not give the final answer.")
REFLECT_SYSTEM = ("You check an attempt at a problem. If it is right, reply CORRECT. Otherwise say in "
                  "one or two sentences what went wrong and how to fix it.")
RETRY_SYSTEM = ("Answer the problem. If the reflection says CORRECT, give the attempt's answer; "
                "otherwise answer again, avoiding the mistake it names.")
VOTE_TEMPERATURE = 0.7  # samples at temperature 0 would all agree: nothing to vote on


@mutation("decompose")
def decompose(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Put a planning step before an llm node: it writes the steps, the node solves them."""
    graph = parents[0]
    planned = {e.dst for e in graph.edges if _system(graph, e.src) == PLAN_SYSTEM}
    targets = [n for n in graph.nodes if isinstance(n, LLMNode) and n.id not in planned
               and n.system != PLAN_SYSTEM]
    if not targets:
        raise MutationError("decompose: every llm node already reads a plan")
    target = ctx.rng.choice(targets)
    pid = fresh_id(graph, f"plan_{target.id}")
    plan = LLMNode(id=pid, system=PLAN_SYSTEM, template=target.template, max_tokens=96)
    solver = graph.replace_node(target.model_copy(update={"template": target.template + "\n\nPlan:\n{" + pid + "}"}))
    feeds = [Edge(src=e.src, dst=pid) for e in graph.edges if e.dst == target.id]  # the plan sees what the node sees
    return solver.model_copy(update={
        "nodes": (*solver.nodes, plan),
        "edges": (*solver.edges, *feeds, Edge(src=pid, dst=target.id)),
        "entry": pid if graph.entry == target.id else graph.entry,
    })


@mutation("best_of_n")
def best_of_n(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Sample an llm node N times and let a vote over the task's answer extractor pick one
    (self-consistency). Budget-aware: N is 5 for short replies, 3 for long ones (over 128
    tokens), so a child costs at most about 400 more tokens per input."""
    graph = parents[0]
    voted = {e.src for e in graph.edges if isinstance(graph.node(e.dst), VoteNode)}
    targets = [n for n in graph.nodes if isinstance(n, LLMNode) and n.samples == 1 and n.id not in voted]
    if not targets:
        raise MutationError("best_of_n: every llm node is already sampled or voted on")
    target = ctx.rng.choice(targets)
    n = 3 if target.max_tokens > 128 else 5
    sampled = target.model_copy(update={"samples": n, "temperature": max(target.temperature, VOTE_TEMPERATURE)})
    vote = VoteNode(id=fresh_id(graph, f"vote_{target.id}"), extract=ctx.extract)
    return insert_after(graph.replace_node(sampled), target.id, vote)


@mutation("reflexion_retry")
def reflexion_retry(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """After an llm node's attempt, reflect on it (what went wrong, or CORRECT) and retry once
    with the reflection in view (Reflexion, Shinn et al. 2023, without the outer trials)."""
    graph = parents[0]
    retried = {e.src for e in graph.edges if _system(graph, e.dst) == RETRY_SYSTEM}
    targets = [n for n in graph.nodes if isinstance(n, LLMNode) and n.id not in retried
               and n.system not in (REFLECT_SYSTEM, RETRY_SYSTEM)]
    if not targets:
        raise MutationError("reflexion_retry: every llm node already has a retry")
    target = ctx.rng.choice(targets)
    rid, tid = fresh_id(graph, f"reflect_{target.id}"), fresh_id(graph, f"retry_{target.id}")
    a = "{" + target.id + "}"
    reflect = LLMNode(id=rid, system=REFLECT_SYSTEM, template=f"Problem: {{input}}\nAttempt: {a}", max_tokens=64)
    retry = LLMNode(id=tid, system=RETRY_SYSTEM, max_tokens=max(64, target.max_tokens),
                    template=f"Problem: {{input}}\nAttempt: {a}\nReflection: {{{rid}}}\nAnswer:")
    child = insert_after(graph, target.id, retry)
    return child.model_copy(update={
        "nodes": (*child.nodes, reflect),
        "edges": (*child.edges, Edge(src=target.id, dst=rid), Edge(src=rid, dst=tid)),
    })


def _system(graph: AgentGraph, node_id: str) -> str:
    """The system prompt of an llm node (others have none): how these operators find their own."""
    node = graph.node(node_id)
    return node.system if isinstance(node, LLMNode) else ""
