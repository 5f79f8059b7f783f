"""Agent graphs: the program half of what evoagent optimizes."""

from evoagent.graph.io import dump_graph, graph_from_dict, load_graph
from evoagent.graph.model import AgentGraph, Demo, Edge, LLMNode, LoopNode, ToolNode, VoteNode
from evoagent.graph.validate import placeholders, validate

__all__ = [
    "AgentGraph",
    "Demo",
    "Edge",
    "LLMNode",
    "LoopNode",
    "ToolNode",
    "VoteNode",
    "dump_graph",
    "graph_from_dict",
    "load_graph",
    "placeholders",
    "validate",
]
