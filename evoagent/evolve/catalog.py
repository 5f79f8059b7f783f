"""The operators task.yaml can name: evoagent's built-ins (imported here, the one place above
them, so that none is imported by the extension point it registers with), plug-ins registered
with ``@evoagent.mutation``, ``module:function`` refs and the ``evoagent.mutations`` entry-point
group.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from evoagent.errors import SpecError
from evoagent.evolve.operators import REGISTRY, Operator


def _load_builtins() -> None:
    from evoagent.evolve import (  # noqa: F401  (each registers its operators)
        edge_learning,
        insights,
        param_search,
        prompt_ops,
        reasoning_ops,
        structure_ops,
    )


OPERATORS = REGISTRY.loading(_load_builtins)
known_operators = OPERATORS.names


def get_operator(name: str) -> Operator:
    """A built-in or registered name, a ``module:function`` ref, or an entry point."""
    if name in OPERATORS:
        return OPERATORS.get(name)
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except Exception as e:  # user code: a SyntaxError or NameError is a spec problem too
            raise SpecError(f"cannot import {name!r}: {type(e).__name__}: {e}") from None
        return _registered_as(fn) or Operator(name, fn)
    for ep in entry_points(group="evoagent.mutations"):
        if ep.name == name:
            fn = ep.load()
            return _registered_as(fn) or Operator(name, fn)
    raise SpecError(f"unknown operator {name!r}; known: {known_operators()}")


def _registered_as(fn: object) -> Operator | None:
    return next((op for op in OPERATORS.registry.entries.values() if op.fn is fn), None)
