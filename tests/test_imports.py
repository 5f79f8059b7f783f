"""The package's import graph, read from the source with ``ast`` (every import counts, lazy and
``TYPE_CHECKING`` ones too): it has no circle, and no module imports a floor above its own
(docs/architecture.md draws the floors and names the one kind of arrow allowed upward)."""

from __future__ import annotations

import sys
from pathlib import Path

import networkx as nx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import code_graph  # noqa: E402

# Lowest floor first; a module may import its own floor and those below.
FLOORS: dict[str, int] = {
    "evoagent.errors": 0, "evoagent.registry": 0, "evoagent.heap": 0,
    "evoagent.spec": 1,
    "evoagent.graph": 2,
    "evoagent.llm": 3, "evoagent.tools": 3, "evoagent.tasks": 3, "evoagent.usercode": 3,
    "evoagent.execute": 4,
    "evoagent.archive": 5,
    "evoagent.evolve": 6, "evoagent.rl": 6, "evoagent.distributed": 6,
    "evoagent.check": 7, "evoagent.runner": 7, "evoagent.report": 7, "evoagent.replay": 7,
    "evoagent.progress": 7, "evoagent": 7,
    "evoagent.cli": 8, "evoagent.__main__": 9,
}
# The spec tree holds each component's own sub-config, defined beside the component: the spec
# floor reads these config modules (and they the registries whose names they validate).
CONFIG_MODULES = {"evoagent.rl.config", "evoagent.tools.sandbox"}


def import_graph() -> nx.DiGraph:
    """evoagent's modules and what each imports (bench/'s scripts left out)."""
    g = code_graph.import_graph()
    return g.subgraph([m for m in g if m == "evoagent" or m.startswith("evoagent.")])


def floor(module: str) -> int:
    owner = max((p for p in FLOORS if module == p or module.startswith(p + ".")), key=len)
    return FLOORS[owner]


def test_the_import_graph_has_no_circle():
    g = import_graph()
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert not circles, f"import circles: {circles}"


def allowed_upward(a: str, b: str) -> bool:
    """The spec reads the sub-configs defined beside their components, and such a config module
    reads its own package's registries (the names it validates)."""
    return (a.startswith("evoagent.spec") and b in CONFIG_MODULES) or (
        a in CONFIG_MODULES and b.rpartition(".")[0] == a.rpartition(".")[0])


def test_no_module_imports_a_floor_above_its_own():
    g = import_graph()
    assert g.has_edge("evoagent.llm.factory", "evoagent.llm.hf")  # the graph sees lazy imports
    up = [(a, b) for a, b in g.edges if floor(b) > floor(a) and not allowed_upward(a, b)]
    assert not up, "imports that run up a floor: " + ", ".join(f"{a} -> {b}" for a, b in up)
