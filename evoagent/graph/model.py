"""``AgentGraph``: an agent as typed nodes and edges, with a canonical form and a content id.

Nodes are frozen pydantic models discriminated by ``kind``; the graph is a DAG whose ``entry``
node receives the input and whose ``exit`` node's output is the answer. Two graphs that differ
only in their ``name`` (or in key order) serialise to the same canonical JSON and so share the
same id: the archive never stores one agent twice.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field

NODE_ID = r"^[a-z][a-z0-9_]{0,39}$"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Demo(_Frozen):
    """A few-shot example: a user message and the assistant reply to imitate."""

    input: str
    output: str


class LLMNode(_Frozen):
    """One chat completion. ``template`` uses ``{input}`` and ``{node_id}`` of upstream nodes."""

    kind: Literal["llm"] = "llm"
    id: str = Field(pattern=NODE_ID)
    system: str = ""
    template: str = "{input}"
    demos: tuple[Demo, ...] = ()
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int = Field(64, ge=1, le=4096)
    samples: int = Field(1, ge=1, le=16, description="completions drawn (a vote node reduces them)")


class ToolNode(_Frozen):
    """Calls a registered tool with the rendered ``template`` as its argument. With ``source``
    (tool ``python`` only) the agent owns the tool: its program, part of the graph and of its
    content id, defines ``main(text: str) -> str`` and runs in the sandbox on the argument
    (``rewrite_tool`` edits it)."""

    kind: Literal["tool"] = "tool"
    id: str = Field(pattern=NODE_ID)
    tool: str
    template: str
    source: str | None = Field(None, description="python: a program defining main(text) -> str")


class LoopNode(_Frozen):
    """A multi-turn loop. With ``tools``: ReAct, the model writes ``Action: tool[argument]`` or
    ``Answer: ...`` each turn. With ``env``: the model plays the input's episode of that
    environment (``evoagent.tasks.envs``), one reply per move, until the game ends."""

    kind: Literal["loop"] = "loop"
    id: str = Field(pattern=NODE_ID)
    system: str = ""
    template: str = "{input}"
    tools: tuple[str, ...] = ()
    env: str | None = Field(None, description="environment registry key (e.g. textarena)")
    max_turns: int = Field(4, ge=1, le=32)
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int = Field(96, ge=1, le=4096)


class VoteNode(_Frozen):
    """Majority vote over the answers of all upstream outputs (self-consistency)."""

    kind: Literal["vote"] = "vote"
    id: str = Field(pattern=NODE_ID)
    extract: str = Field("last_number", description="extractor that turns text into an answer")


Node = Annotated[LLMNode | ToolNode | LoopNode | VoteNode, Field(discriminator="kind")]


class Edge(_Frozen):
    """Data flows from ``src`` to ``dst``; with ``p`` the edge is kept with that probability."""

    src: str
    dst: str
    p: float | None = Field(None, ge=0, le=1, description="GPTSwarm-style edge probability")


_LATER_FIELDS = ("env", "source")  # node fields left out of the canonical form while None (see canonical)


class AgentGraph(_Frozen):
    """An agent program. Build it with ``from_dict``/``load_graph``; validate with ``validate``."""

    name: str = "agent"
    entry: str
    exit: str
    nodes: tuple[Node, ...] = Field(min_length=1)
    edges: tuple[Edge, ...] = ()

    def node(self, node_id: str) -> LLMNode | ToolNode | LoopNode | VoteNode:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def digraph(self) -> nx.DiGraph:
        """The structure as a networkx DiGraph (node attribute ``kind``, edge attribute ``p``)."""
        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.id, kind=n.kind)
        for e in self.edges:
            g.add_edge(e.src, e.dst, p=e.p)
        return g

    def canonical(self) -> dict:
        """Order-independent content: nodes by id, edges by (src, dst), defaults included,
        except fields added after the first release while they hold their ``None`` default
        (``_LATER_FIELDS``), so that adding a field never changes the id of an archived agent."""
        data = self.model_dump(mode="json", exclude={"name"})
        for n in data["nodes"]:
            for key in _LATER_FIELDS:
                if key in n and n[key] is None:
                    del n[key]
        data["nodes"] = sorted(data["nodes"], key=lambda n: n["id"])
        data["edges"] = sorted(data["edges"], key=lambda e: (e["src"], e["dst"]))
        return data

    def canonical_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))

    @property
    def id(self) -> str:
        """Content hash of the canonical JSON: equal programs get equal ids."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:12]

    def replace_node(self, node: LLMNode | ToolNode | LoopNode | VoteNode) -> AgentGraph:
        """A copy with the node of the same id swapped for ``node``."""
        nodes = tuple(node if n.id == node.id else n for n in self.nodes)
        return self.model_copy(update={"nodes": nodes})

    def to_yaml_dict(self) -> dict:
        """What ``graph export`` writes: readable, default-valued fields left out (but ``kind``
        always kept, since it picks the node type when the file is read back)."""
        return {
            "name": self.name,
            "entry": self.entry,
            "exit": self.exit,
            "nodes": [
                {"kind": n.kind, **n.model_dump(mode="json", exclude_defaults=True)} for n in self.nodes
            ],
            "edges": [e.model_dump(mode="json", exclude_defaults=True) for e in self.edges],
        }
