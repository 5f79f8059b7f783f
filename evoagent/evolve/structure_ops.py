"""Operators that change the graph's shape: insert a tool node before or after an llm node, add
a revise step, remove a node, and crossover of two parents (GEPA's merge, node-wise).

Each returns a new graph or raises ``MutationError`` when it does not apply; the loop validates
every child before it runs, so an operator may produce an invalid graph only by bug, and that
child is archived as invalid with the validator's reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from evoagent.errors import MutationError
from evoagent.evolve.operators import MutationContext, mutation
from evoagent.graph.model import AgentGraph, Edge, LLMNode, LoopNode, Node, ToolNode, VoteNode
from evoagent.tools.base import make_tool

REVISE_SYSTEM = "You check a draft answer step by step and correct it if it is wrong."
REVISE_TEMPLATE = "Question: {{input}}\nDraft answer: {{{src}}}\nReply with the corrected final answer."
DELEGATE_SYSTEM = "Write the input for the {name} tool, which {description}. Reply with only that input."


def fresh_id(graph: AgentGraph, stem: str) -> str:
    """A node id not used in ``graph``: ``stem``, ``stem_2``, ..."""
    stem = re.sub(r"[^a-z0-9_]", "_", stem.lower()).strip("_")[:30] or "node"
    if not stem[0].isalpha():
        stem = "n_" + stem
    used = {n.id for n in graph.nodes}
    k, name = 1, stem
    while name in used:
        k += 1
        name = f"{stem}_{k}"
    return name


def _rename_ref(node, old: str, new: str):
    """``node`` with ``{old}`` in its template replaced by ``{new}``."""
    if isinstance(node, VoteNode):
        return node
    return node.model_copy(update={"template": node.template.replace("{" + old + "}", "{" + new + "}")})


@mutation("insert_tool")
def insert_tool(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Run a tool on the input before an llm node and show the node the tool's result."""
    graph = parents[0]
    if not ctx.tools:
        raise MutationError("insert_tool: the task lists no tools (task.tools)")
    tool = ctx.rng.choice(ctx.tools)
    same_tool = {n.id for n in graph.nodes if isinstance(n, ToolNode) and n.tool == tool}
    fed = {e.dst for e in graph.edges if e.src in same_tool}
    targets = [n for n in graph.nodes if isinstance(n, LLMNode) and n.id not in fed]
    if not targets:
        raise MutationError(f"insert_tool: every llm node already sees {tool!r}")
    target = ctx.rng.choice(targets)
    tnode = ToolNode(id=fresh_id(graph, tool.split(":")[-1]), tool=tool, template="{input}")
    return insert_before(graph, target, tnode, tool.split(":")[-1])


def insert_before(graph: AgentGraph, target: LLMNode, tool: ToolNode, label: str) -> AgentGraph:
    """``tool`` runs on the input before ``target``, which is shown ``<label> result: ...``."""
    new_target = target.model_copy(update={"template": target.template + f"\n\n{label} result: {{{tool.id}}}"})
    edges = [*graph.edges, Edge(src=tool.id, dst=target.id)]
    entry = graph.entry
    if target.id == graph.entry:
        entry = tool.id
    else:
        edges.append(Edge(src=graph.entry, dst=tool.id))
    nodes = [new_target if n.id == target.id else n for n in graph.nodes] + [tool]
    return graph.model_copy(update={"nodes": tuple(nodes), "edges": tuple(edges), "entry": entry})


@mutation("delegate_to_tool")
def delegate_to_tool(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Let an llm node write a tool's argument and the tool compute the result (PAL, PoT).

    Program-aided models (Gao et al. 2022) answer by writing an expression or program that a
    tool runs: the model does the translation it is good at and the tool the exact part it is
    bad at. The chosen node is told to write only the tool's input; a tool node reads its reply,
    and the node's consumers (or the graph's exit) read the tool's result instead.
    """
    graph = parents[0]
    if not ctx.tools:
        raise MutationError("delegate_to_tool: the task lists no tools (task.tools)")
    tool = ctx.rng.choice(ctx.tools)
    fed_to_tool = {e.src for e in graph.edges if isinstance(graph.node(e.dst), ToolNode)}
    targets = [n for n in graph.nodes if isinstance(n, LLMNode) and n.id not in fed_to_tool]
    if not targets:
        raise MutationError("delegate_to_tool: every llm node already feeds a tool")
    target = ctx.rng.choice(targets)
    impl = make_tool(tool)
    short = tool.split(":")[-1]
    tid = fresh_id(graph, short)
    writer = target.model_copy(update={
        "system": DELEGATE_SYSTEM.format(name=short, description=impl.description.rstrip(".")),
        "demos": (),  # demos of the old reply format would teach the wrong output
    })
    tool_node = ToolNode(id=tid, tool=tool, template="{" + target.id + "}")
    return insert_after(graph.replace_node(writer), target.id, tool_node)


@mutation("add_node")
def add_node(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Add a revise step after a node: it reads the draft and answers again (Reflexion-like)."""
    graph = parents[0]
    sources = [n for n in graph.nodes if isinstance(n, LLMNode | LoopNode | VoteNode)]
    if not sources:
        raise MutationError("add_node: no node whose answer could be revised")
    src = ctx.rng.choice(sources)
    rid = fresh_id(graph, "revise")
    revise = LLMNode(id=rid, system=REVISE_SYSTEM, template=REVISE_TEMPLATE.format(src=src.id),
                     max_tokens=64)
    return insert_after(graph, src.id, revise)


def insert_after(graph: AgentGraph, src: str, node: Node) -> AgentGraph:
    """``graph`` with ``node`` between ``src`` and its consumers: ``src`` feeds ``node``, which
    takes over ``src``'s out-edges, the consumers' ``{src}`` placeholders and the exit."""
    edges = [Edge(src=node.id, dst=e.dst, p=e.p) if e.src == src else e for e in graph.edges]
    moved = {e.dst for e in graph.edges if e.src == src}
    nodes = [_rename_ref(n, src, node.id) if n.id in moved else n for n in graph.nodes] + [node]
    edges.append(Edge(src=src, dst=node.id))
    exit_ = node.id if graph.exit == src else graph.exit
    return graph.model_copy(update={"nodes": tuple(nodes), "edges": tuple(edges), "exit": exit_})


@mutation("remove_node")
def remove_node(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Remove a node that has exactly one input; its consumers read that input instead."""
    graph = parents[0]
    g = graph.digraph()
    removable = [n for n in g.nodes if n != graph.entry and g.in_degree(n) == 1]
    if not removable:
        raise MutationError("remove_node: no node with exactly one input to bypass")
    victim = ctx.rng.choice(sorted(removable))
    (pred,) = list(g.predecessors(victim))
    succs = set(g.successors(victim))
    edges = {(e.src, e.dst): e for e in graph.edges if victim not in (e.src, e.dst)}
    for s in succs:
        edges.setdefault((pred, s), Edge(src=pred, dst=s))
    nodes = [_rename_ref(n, victim, pred) if n.id in succs else n for n in graph.nodes if n.id != victim]
    exit_ = pred if graph.exit == victim else graph.exit
    return graph.model_copy(
        update={"nodes": tuple(nodes), "edges": tuple(edges.values()), "exit": exit_}
    )


@mutation("crossover", parents=2)
def crossover(parents: Sequence[AgentGraph], ctx: MutationContext) -> AgentGraph:
    """Keep the first parent's structure; take each node both parents share from either."""
    a, b = parents[0], parents[1]
    kinds = {n.id: n.kind for n in a.nodes}
    shared = {n.id: n for n in b.nodes if kinds.get(n.id) == n.kind}
    if not shared:
        raise MutationError("crossover: the parents share no node of the same id and kind")
    nodes = tuple(shared[n.id] if n.id in shared and ctx.rng.random() < 0.5 else n for n in a.nodes)
    child = a.model_copy(update={"nodes": nodes})
    if child.id in (a.id, b.id):
        # The coin flips reproduced a parent: force one shared node that differs to come from b.
        differ = [i for i in shared if shared[i] != a.node(i)]
        if not differ:
            raise MutationError("crossover: the shared nodes are identical in both parents")
        child = a.replace_node(shared[ctx.rng.choice(sorted(differ))])
    return child
