"""The operators task.yaml can name: evoagent's built-ins (imported here, the one place above
them, so that none is imported by the extension point it registers with), plug-ins registered
with ``@evoagent.mutation``, ``module:function`` refs and the ``evoagent.mutations`` entry-point
group.
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points

from evoagent.errors import SpecError
from evoagent.evolve.operators import REGISTRY, Operator


def _load_builtins() -> None:
    from evoagent.evolve import (  # noqa: F401  (each registers its operators)
        code_ops,
        edge_learning,
        insights,
        instruction_search,
        param_search,
        prompt_ops,
        reasoning_ops,
        structure_ops,
    )


OPERATORS = REGISTRY.loading(_load_builtins)
GROUP = "evoagent.mutations"  # the entry-point group an installed package declares operators in


def known_operators() -> list[str]:
    """Every name task.yaml can give without a ``module:function`` ref: built-ins, registered
    plug-ins and the installed packages' entry points."""
    return sorted({*OPERATORS.names(), *(ep.name for ep in entry_points(group=GROUP))})


def get_operator(name: str) -> Operator:
    """A built-in or registered name, a ``module:function`` ref, or an entry point."""
    if name in OPERATORS:
        if (ep := _entry_point(name)) is not None:  # silently running ours would hide theirs
            raise SpecError(f"operator {name!r} is built in, and package {_package(ep)!r} also declares it "
                            f"({ep.value}); rename the plug-in's entry point")
        return OPERATORS.get(name)
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except Exception as e:  # user code: a SyntaxError or NameError is a spec problem too
            raise SpecError(f"cannot import {name!r}: {type(e).__name__}: {e}") from None
        return _registered_as(fn) or Operator(name, fn)
    if (ep := _entry_point(name)) is None:
        raise SpecError(f"unknown operator {name!r}; known: {known_operators()}")
    try:
        fn = ep.load()
    except Exception as e:  # an installed package's code: its import errors are the user's to fix
        raise SpecError(f"operator {name!r} from package {_package(ep)!r} ({ep.value}) cannot be "
                        f"loaded: {type(e).__name__}: {e}") from None
    return _registered_as(fn) or Operator(name, fn)


def _entry_point(name: str) -> EntryPoint | None:
    """The one installed entry point called ``name``; two packages claiming it is an error that
    names both, since which one would run depends on install order."""
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if len(found) > 1:
        claims = ", ".join(f"{_package(ep)!r} ({ep.value})" for ep in found)
        raise SpecError(f"operator {name!r} is declared by more than one installed package: {claims}; "
                        "uninstall one, or name the function as 'module:function'")
    return found[0] if found else None


def _package(ep: EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "?"


def _registered_as(fn: object) -> Operator | None:
    return next((op for op in OPERATORS.registry.entries.values() if op.fn is fn), None)
