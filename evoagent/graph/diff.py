"""What changed between two agent graphs, as a person reviewing a mutation wants to read it:
nodes added and removed, each changed field of a kept node (prompt text as a unified diff,
numbers as old -> new), edges added and removed, and a moved entry or exit."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from evoagent.graph.model import AgentGraph

TEXT_FIELDS = ("system", "template", "source")  # shown as unified diffs


@dataclass(frozen=True)
class FieldChange:
    node: str
    field: str
    old: Any
    new: Any

    def render(self) -> str:
        """``old -> new``, or a unified diff for prompt text and demos."""
        if self.field in TEXT_FIELDS or self.field == "demos":
            old, new = _text(self.old), _text(self.new)
            lines = difflib.unified_diff(old.splitlines(), new.splitlines(),
                                         f"{self.node}.{self.field} (a)", f"{self.node}.{self.field} (b)",
                                         lineterm="")
            return "\n".join(lines)
        return f"{self.old!r} -> {self.new!r}"

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "field": self.field, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class GraphDiff:
    nodes_added: list[str] = field(default_factory=list)
    nodes_removed: list[str] = field(default_factory=list)
    changes: list[FieldChange] = field(default_factory=list)
    edges_added: list[tuple[str, str]] = field(default_factory=list)
    edges_removed: list[tuple[str, str]] = field(default_factory=list)
    ends: list[FieldChange] = field(default_factory=list)  # entry / exit moves

    @property
    def empty(self) -> bool:
        return not (self.nodes_added or self.nodes_removed or self.changes or self.edges_added
                    or self.edges_removed or self.ends)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes_added": self.nodes_added,
            "nodes_removed": self.nodes_removed,
            "changes": [c.to_dict() for c in self.changes + self.ends],
            "edges_added": [list(e) for e in self.edges_added],
            "edges_removed": [list(e) for e in self.edges_removed],
        }


def graph_diff(a: AgentGraph, b: AgentGraph) -> GraphDiff:
    """The changes that turn ``a`` into ``b`` (names of the graphs are not compared)."""
    na = {n.id: n.model_dump(mode="json") for n in a.nodes}
    nb = {n.id: n.model_dump(mode="json") for n in b.nodes}
    changes = [
        FieldChange(node, key, na[node].get(key), nb[node].get(key))
        for node in sorted(na.keys() & nb.keys())
        for key in sorted(na[node].keys() | nb[node].keys())
        if na[node].get(key) != nb[node].get(key)
    ]
    ea = {(e.src, e.dst): e.p for e in a.edges}
    eb = {(e.src, e.dst): e.p for e in b.edges}
    changes += [FieldChange(f"{s}->{d}", "p", ea[(s, d)], eb[(s, d)])
                for s, d in sorted(ea.keys() & eb.keys()) if ea[(s, d)] != eb[(s, d)]]
    ends = [FieldChange("graph", end, getattr(a, end), getattr(b, end))
            for end in ("entry", "exit") if getattr(a, end) != getattr(b, end)]
    return GraphDiff(
        nodes_added=sorted(nb.keys() - na.keys()),
        nodes_removed=sorted(na.keys() - nb.keys()),
        changes=changes,
        edges_added=sorted(eb.keys() - ea.keys()),
        edges_removed=sorted(ea.keys() - eb.keys()),
        ends=ends,
    )


def _text(value: Any) -> str:
    if isinstance(value, list):  # demos: one "user => assistant" block each
        return "\n".join(f"[demo] {d['input']}\n  => {d['output']}" for d in value)
    return "" if value is None else str(value)
