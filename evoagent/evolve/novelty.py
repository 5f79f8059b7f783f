"""Novelty rejection: a child too close to an archived agent is refused before any evaluation.

A mutator often proposes a child that differs from an archived agent only in wording or
spacing (a rewrite that restates the prompt, demos in another order). Evaluating it spends a
cascade minibatch on a known program. As in ShinkaEvolve, such a child is rejected first and
archived as ``duplicate``, with its nearest neighbour and their similarity as the reason.

Similarity of two graphs: 0 when their *shape* differs (node kinds, ids and parameters, edges,
entry and exit: everything but the text), else the Jaccard similarity of their normalised
prompt text (system prompts, templates and demos; lower case, punctuation and spacing dropped)
as sets of word trigrams. A parameter change (temperature, samples, max_tokens) or a new node is
always novel; a reworded prompt is novel when enough of its trigrams are new.

The index is derived from the archive (valid agents' graphs, grouped by shape, so a child is
compared only with agents of its own shape) and extended as children are accepted.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from evoagent.graph.model import AgentGraph

TEXT_FIELDS = ("system", "template", "demos")
_WORD = re.compile(r"[a-z0-9]+")


def shape_key(graph: AgentGraph) -> str:
    """A hash of everything in ``graph`` but its prompt text."""
    data = graph.canonical()
    for node in data["nodes"]:
        for key in TEXT_FIELDS:
            node.pop(key, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def trigrams(graph: AgentGraph) -> frozenset[tuple[str, ...]]:
    """The word trigrams of ``graph``'s normalised prompt text (node by node, in id order)."""
    out: set[tuple[str, ...]] = set()
    for node in sorted(graph.nodes, key=lambda n: n.id):
        parts = [getattr(node, "system", ""), getattr(node, "template", "")]
        parts += [f"{d.input} {d.output}" for d in getattr(node, "demos", ())]
        words = [node.id, *_WORD.findall(" ".join(parts).lower())]
        out.update(tuple(words[i : i + 3]) for i in range(max(1, len(words) - 2)))
    return frozenset(out)


def similarity(a: frozenset[tuple[str, ...]], b: frozenset[tuple[str, ...]]) -> float:
    """Jaccard similarity of two trigram sets (1.0 for two empty texts)."""
    union = len(a | b)
    return len(a & b) / union if union else 1.0


@dataclass(frozen=True)
class Neighbour:
    id: str
    similarity: float


class NoveltyIndex:
    """Archived graphs by shape, for the nearest neighbour of a child."""

    def __init__(self, graphs: Iterable[tuple[str, AgentGraph]] = ()) -> None:
        self._by_shape: dict[str, list[tuple[str, frozenset[tuple[str, ...]]]]] = {}
        for agent_id, graph in graphs:
            self.add(agent_id, graph)

    def add(self, agent_id: str, graph: AgentGraph) -> None:
        self._by_shape.setdefault(shape_key(graph), []).append((agent_id, trigrams(graph)))

    def nearest(self, graph: AgentGraph) -> Neighbour | None:
        """The most similar indexed agent of the same shape (the first indexed among equals),
        or None when no agent has this shape."""
        text = trigrams(graph)
        best: Neighbour | None = None
        for agent_id, other in self._by_shape.get(shape_key(graph), ()):
            sim = similarity(text, other)
            if best is None or sim > best.similarity:
                best = Neighbour(agent_id, sim)
        return best
