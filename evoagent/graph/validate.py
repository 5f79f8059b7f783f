"""Structural checks of an AgentGraph; each failure names the node or edge at fault.

Checked: unique node ids, entry/exit exist, edges name existing nodes, no self-loops or cycles,
every node reachable from ``entry`` and reaching ``exit``, template placeholders name ``input``
or an upstream node, tools are registered, vote nodes have inputs, no empty prompt template.
"""

from __future__ import annotations

import ast
import string
from collections.abc import Collection

import networkx as nx

from evoagent.errors import GraphError
from evoagent.graph.model import AgentGraph, LLMNode, LoopNode, ToolNode, VoteNode


def placeholders(template: str) -> list[str]:
    """Field names used by a ``str.format`` template; malformed braces raise GraphError."""
    try:
        return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise GraphError(f"template {template[:40]!r}: {e}") from None


def validate(graph: AgentGraph, tools: Collection[str], envs: Collection[str] | None = None) -> AgentGraph:
    """Return ``graph`` if it is runnable, else raise GraphError saying where it is not.
    ``tools`` are the tool names its nodes may call; ``envs``, when given, the environments
    a loop may play (the spec check passes the registry's; no operator changes a loop's env)."""
    ids = [n.id for n in graph.nodes]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise GraphError(f"duplicate node id(s): {dupes}")
    for end in ("entry", "exit"):
        if getattr(graph, end) not in ids:
            raise GraphError(f"{end} {getattr(graph, end)!r} is not a node (nodes: {ids})")
    for e in graph.edges:
        for side in ("src", "dst"):
            if getattr(e, side) not in ids:
                raise GraphError(f"edge {e.src}->{e.dst}: {side} {getattr(e, side)!r} is not a node")
        if e.src == e.dst:
            raise GraphError(f"edge {e.src}->{e.dst}: a node cannot feed itself")
    g = graph.digraph()
    if not nx.is_directed_acyclic_graph(g):
        cycle = " -> ".join(u for u, _ in nx.find_cycle(g))
        raise GraphError(f"graph has a cycle: {cycle}")
    if g.in_degree(graph.entry) != 0:
        raise GraphError(f"entry {graph.entry!r} must have no incoming edges")
    reach = nx.descendants(g, graph.entry) | {graph.entry}
    to_exit = nx.ancestors(g, graph.exit) | {graph.exit}
    for n in graph.nodes:
        if n.id not in reach:
            raise GraphError(f"node {n.id!r} is not reachable from entry {graph.entry!r}")
        if n.id not in to_exit:
            raise GraphError(f"node {n.id!r} does not lead to exit {graph.exit!r}")
        _check_node(n, set(nx.ancestors(g, n.id)), tools, envs)
        if isinstance(n, VoteNode) and g.in_degree(n.id) == 0:
            raise GraphError(f"vote node {n.id!r} has no inputs")
    return graph


def _check_node(
    node: LLMNode | ToolNode | LoopNode | VoteNode, upstream: set[str], tools: Collection[str],
    envs: Collection[str] | None,
) -> None:
    if isinstance(node, VoteNode):
        return
    if not node.template.strip():
        raise GraphError(f"node {node.id!r}: empty prompt template")
    for name in placeholders(node.template):
        if name != "input" and name not in upstream:
            allowed = sorted({"input"} | upstream)
            raise GraphError(
                f"node {node.id!r}: template placeholder {{{name}}} is neither input nor an "
                f"upstream node (allowed: {allowed})"
            )
    if isinstance(node, LoopNode) and node.env is not None:
        if node.tools:
            raise GraphError(f"node {node.id!r}: a loop plays either an env or tools, not both")
        if envs is not None and node.env not in envs:
            raise GraphError(f"node {node.id!r}: unknown env {node.env!r}; known: {sorted(envs)}")
    if isinstance(node, ToolNode) and node.source is not None:
        check_source(node)
    used = [node.tool] if isinstance(node, ToolNode) else list(getattr(node, "tools", ()))
    for tool in used:
        if tool not in tools and ":" not in tool:
            raise GraphError(f"node {node.id!r}: unknown tool {tool!r}; known: {sorted(tools)}")


def check_source(node: ToolNode) -> None:
    """A tool the agent owns: a python program that compiles and defines ``main``."""
    if node.tool != "python":
        raise GraphError(f"node {node.id!r}: source is a python program; tool must be 'python', not {node.tool!r}")
    try:
        tree = ast.parse(node.source or "", filename=f"<tool {node.id}>")
    except SyntaxError as e:
        raise GraphError(f"node {node.id!r}: source does not compile: {e.msg} (line {e.lineno})") from None
    if not any(isinstance(d, ast.FunctionDef) and d.name == "main" for d in tree.body):
        raise GraphError(f"node {node.id!r}: source defines no main(text) function (a plain def: it is called, not awaited)")
