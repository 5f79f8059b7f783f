"""Graph files: YAML in, YAML out, with errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from evoagent.errors import GraphError, SpecError
from evoagent.graph.model import AgentGraph
from evoagent.spec.load import read_yaml, validate


def graph_from_dict(data: Any, source: str) -> AgentGraph:
    """Validate a mapping as an AgentGraph (schema only; see ``graph.validate`` for structure)."""
    try:
        return validate(AgentGraph, data, source)
    except SpecError as e:
        raise GraphError(str(e)) from None


def load_graph(path: Path | str) -> AgentGraph:
    """Read a graph YAML file."""
    path = Path(path)
    try:
        data = read_yaml(path)
    except SpecError as e:
        raise GraphError(str(e)) from None
    return graph_from_dict(data, str(path))


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (prompts) as ``|`` blocks, as a person would."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_graph(graph: AgentGraph) -> str:
    """Readable YAML of a graph (defaults left out, prompts as block strings)."""
    return yaml.dump(graph.to_yaml_dict(), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
