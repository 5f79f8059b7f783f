"""The task.yaml reference (``docs/settings.md``), written from the config models themselves, so
the documented fields, defaults and meanings are the ones the loader enforces; a test keeps the
file equal to what this module writes (``python -m evoagent.spec.reference > docs/settings.md``).
"""

from __future__ import annotations

import types
import typing

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from evoagent.spec.config import RunSpec

HEADER = """# task.yaml settings

Every key a task.yaml may hold, with its default and meaning. Unknown keys are refused with
their path. Generated from `evoagent/spec/config.py` by `python -m evoagent.spec.reference`;
`tests/test_docs.py` fails when this file falls behind the code.
"""
_HIDDEN = {"base_dir"}  # set by the loader, not by the user


def _models(annotation: object) -> list[type[BaseModel]]:
    """The config models an annotation holds (``X``, ``X | None``, ``tuple[X, ...]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        return [m for a in typing.get_args(annotation) for m in _models(a)]
    return []


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "none"
    if isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
        return "[" + ", ".join(v.model_dump_json(exclude_defaults=True) for v in value) + "]"
    return f"`{value!r}`" if not isinstance(value, str) else f"`{value}`"


def _section(path: str, model: type[BaseModel], out: list[str], seen: set[type]) -> None:
    doc = " ".join((model.__doc__ or "").split()).replace("``", "`")
    out += ["", f"## `{path or 'top level'}`", "", doc, "", "| key | default | meaning |", "|---|---|---|"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        if name in _HIDDEN:
            continue
        key = f"{path}.{name}" if path else name
        meaning = " ".join((field.description or "").split()).replace("|", "\\|")
        for sub in _models(field.annotation):
            if sub in seen:
                meaning = meaning or f"a `{sub.__name__}` section"
            else:
                seen.add(sub)
                nested.append((key, sub))
                meaning = meaning or f"see `{key}` below"
        out.append(f"| `{name}` | {_default(field)} | {meaning} |")
    for sub_path, sub in nested:
        _section(sub_path, sub, out, seen)


def settings_markdown() -> str:
    """docs/settings.md, section by section in the order task.yaml nests them."""
    out = [HEADER.rstrip()]
    _section("", RunSpec, out, {RunSpec})
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(settings_markdown(), end="")
