"""Read task.yaml and graph files safely and turn every problem into one readable SpecError.

Safe by construction: ``yaml.safe_load`` only (tags that would build Python objects are
refused), a size cap, strict UTF-8, and a cap on aliases (a "billion laughs" file expands
exponentially once validated) and on the expanded size, and no duplicate keys (YAML would
silently keep the last one). Validation errors name the field path, the allowed values, and
for an unknown key the closest known one.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from evoagent.errors import SpecError

MAX_BYTES = 1_000_000
MAX_ALIASES = 100
MAX_NODES = 100_000  # expanded size: no real task or graph file comes near it


def read_yaml(path: Path) -> Any:
    """Parse one YAML file; every failure is a SpecError naming the file (and line)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e.strerror})") from None
    if path.is_dir():
        raise SpecError(f"{path}: is a folder, expected a YAML file")
    if size > MAX_BYTES:
        raise SpecError(f"{path}: {size} bytes is larger than the {MAX_BYTES}-byte limit")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 (byte {e.start}: {e.reason})") from None
    return parse_yaml(text, str(path))


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text with safe loading, the alias and expansion caps, and no duplicate keys."""
    try:
        aliases = sum(isinstance(ev, yaml.AliasEvent) for ev in yaml.parse(text, Loader=yaml.SafeLoader))
        if aliases > MAX_ALIASES:
            raise SpecError(f"{source}: {aliases} YAML aliases (limit {MAX_ALIASES}); refusing")
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None:
            _check_nodes(root, source)
        return yaml.safe_load(text)
    except yaml.constructor.ConstructorError as e:
        raise SpecError(f"{source}:{_line(e)}: {e.problem} (only plain YAML is allowed)") from None
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(f"{source}:{_line(e)}: YAML syntax error: {problem}") from None


def _check_nodes(root: yaml.Node, source: str) -> None:
    """Refuse duplicate mapping keys (YAML would keep the last silently) and alias bombs.

    A few aliases can nest into billions of nodes once expanded ("billion laughs"); the
    expanded size is counted on the composed graph, where an alias is a shared node, so the
    count itself never expands anything.
    """
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 1  # a recursive alias counts once instead of looping
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        raise SpecError(
                            f"{source}:line {key.start_mark.line + 1}: duplicate key {key.value!r} "
                            f"(first at line {seen[key.value]})"
                        )
                    seen[key.value] = key.start_mark.line + 1
                total += size(key) + size(value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        sizes[id(node)] = total
        return total

    expanded = size(root)
    if expanded > MAX_NODES:
        raise SpecError(f"{source}: expands to {expanded:,} YAML nodes (limit {MAX_NODES:,}); refusing")


def _line(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    return f"line {mark.line + 1}" if mark is not None else "?"


def validate(model: type[BaseModel], data: Any, source: str) -> Any:
    """Validate ``data`` against ``model``; raise one SpecError listing every problem."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        lines = [_describe(err, model) for err in e.errors()]
        raise SpecError(f"{source}: invalid\n" + "\n".join(f"  {ln}" for ln in lines)) from None


def _describe(err: Any, model: type[BaseModel]) -> str:
    path = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        key = str(err["loc"][-1])
        known = _fields_at(model, err["loc"][:-1])
        hint = difflib.get_close_matches(key, known, n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        return f"{path}: unknown key{suggestion} (known: {', '.join(sorted(known))})"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"{path}: required field is missing"
    return f"{path}: {msg} (got {err.get('input')!r})"


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the sub-model at ``loc`` (best effort; [] when it is not a model)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", {})
        if part not in fields:
            return []
        current = _model_of(fields[part].annotation)
    return list(getattr(current, "model_fields", {}))


def _model_of(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
