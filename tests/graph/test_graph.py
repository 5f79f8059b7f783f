"""AgentGraph: equal programs share one id; broken graphs are refused with the node at fault."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from evoagent.errors import GraphError
from evoagent.graph import (
    AgentGraph,
    LLMNode,
    ToolNode,
    dump_graph,
    graph_from_dict,
    load_graph,
    validate,
)
from evoagent.tools import known_tools

ROOT = Path(__file__).resolve().parents[2]


def two_step(**kw) -> AgentGraph:
    data = {
        "name": "x",
        "entry": "calc",
        "exit": "answer",
        "nodes": [
            {"kind": "tool", "id": "calc", "tool": "calculator", "template": "{input}"},
            {"kind": "llm", "id": "answer", "template": "{input} = {calc}"},
        ],
        "edges": [{"src": "calc", "dst": "answer"}],
    }
    data.update(kw)
    return graph_from_dict(data, "test")


@pytest.mark.parametrize("path", sorted((ROOT / "graphs").glob("*.yaml")), ids=lambda p: p.stem)
def test_seed_library_is_valid_and_round_trips(path):
    g = validate(load_graph(path), known_tools())
    again = graph_from_dict(yaml.safe_load(dump_graph(g)), "dump")
    assert again.id == g.id and again.name == g.name


def test_id_ignores_name_and_order_but_not_content():
    g = two_step()
    shuffled = two_step(name="other", nodes=list(reversed(two_step().model_dump()["nodes"])))
    assert g.id == shuffled.id
    changed = g.replace_node(LLMNode(id="answer", template="{input} is {calc}"))
    assert changed.id != g.id
    assert g.canonical_json() == shuffled.canonical_json()


def test_digraph_has_nodes_and_edges():
    d = two_step().digraph()
    assert set(d.nodes) == {"calc", "answer"} and list(d.edges) == [("calc", "answer")]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"exit": "nope"}, r"exit 'nope' is not a node"),
        ({"edges": [{"src": "calc", "dst": "ghost"}]}, r"dst 'ghost' is not a node"),
        ({"edges": [{"src": "answer", "dst": "calc"}]}, r"entry 'calc' must have no incoming"),
        ({"edges": []}, r"node 'calc' does not lead to exit 'answer'"),
    ],
)
def test_structural_errors_name_the_culprit(change, message):
    with pytest.raises(GraphError, match=message):
        validate(two_step(**change), known_tools())


def test_cycle_is_reported_with_its_path():
    g = graph_from_dict(
        {
            "entry": "a", "exit": "c",
            "nodes": [{"kind": "llm", "id": i} for i in "abc"],
            "edges": [{"src": "a", "dst": "b"}, {"src": "b", "dst": "c"}, {"src": "c", "dst": "b"}],
        },
        "t",
    )
    with pytest.raises(GraphError, match=r"cycle: (b -> c|c -> b)"):
        validate(g, known_tools())


def test_placeholder_must_name_an_upstream_node():
    g = two_step().replace_node(LLMNode(id="answer", template="{input} {later}"))
    with pytest.raises(GraphError, match=r"node 'answer': template placeholder \{later\}"):
        validate(g, known_tools())


def test_unknown_tool_lists_the_known():
    g = two_step().replace_node(ToolNode(id="calc", tool="abacus", template="{input}"))
    with pytest.raises(GraphError, match=r"unknown tool 'abacus'; known: .*calculator"):
        validate(g, known_tools())


def test_schema_errors_name_the_field():
    with pytest.raises(GraphError, match=r"nodes\.0"):
        graph_from_dict({"entry": "a", "exit": "a", "nodes": [{"kind": "llm", "id": "Bad Id!"}]}, "t")
    with pytest.raises(GraphError, match="duplicate node id"):
        validate(
            graph_from_dict(
                {"entry": "a", "exit": "a", "nodes": [{"kind": "llm", "id": "a"}, {"kind": "llm", "id": "a"}]}, "t"
            ),
            known_tools(),
        )
