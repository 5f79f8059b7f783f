"""The tool extension point: an async callable from one string argument to a ``ToolResult``.

A tool is what a ReAct node calls: the LLM writes ``Action: <name>[<argument>]``, the executor
calls ``call_tool`` and pastes ``ToolResult.output`` (or the error) back as the observation.

Contract for a ``Tool``:
  - ``name`` is the registry key, ``description`` one line shown to the LLM;
  - ``__call__`` never mutates ``ctx``; a bad argument (no expression, code that crashes) is
    returned as ``ToolResult(ok=False, error=...)``, not raised;
  - only a systemic fault (the sandbox cannot start at all) raises ``SandboxError``.

Tools are found by ``make_tool(name)``: a registered name, or ``"module:attr"`` naming a Tool,
a Tool class, or a plain function ``f(argument: str) -> str`` (sync or async). Given a
``UserCode`` pool, a synchronous function runs in a worker process that is killed when its
call times out (``evoagent.usercode``); an async one is cancelled.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from evoagent.errors import SandboxError, ToolError, UserCodeError
from evoagent.tools.sandbox import SandboxConfig
from evoagent.usercode import UserCode


@dataclass(frozen=True)
class ToolResult:
    """One tool call's outcome; ``error`` says why when ``ok`` is False."""

    output: str
    ok: bool = True
    error: str | None = None


@dataclass(frozen=True)
class ToolContext:
    """What a tool may use besides its argument."""

    sandbox: SandboxConfig = field(default_factory=SandboxConfig)


@runtime_checkable
class Tool(Protocol):
    """An async function of one string; see the module docstring for the contract."""

    name: str
    description: str

    async def __call__(self, argument: str, ctx: ToolContext) -> ToolResult: ...


T = TypeVar("T")
_REGISTRY: dict[str, Tool] = {}


def register_tool(tool: T) -> T:
    """Register a Tool instance or a no-argument Tool class under its ``name``; return it.

    Usable as a class decorator. Registering a different tool under a taken name raises
    ToolError; re-registering the same class (e.g. a module reload) replaces the entry.
    """
    instance = tool() if inspect.isclass(tool) else tool
    if not isinstance(instance, Tool):
        raise ToolError(f"{tool!r} is not a Tool (needs name, description, async __call__)")
    existing = _REGISTRY.get(instance.name)
    if existing is not None and type(existing).__qualname__ != type(instance).__qualname__:
        raise ToolError(f"tool name {instance.name!r} is already registered by {existing!r}")
    _REGISTRY[instance.name] = instance
    return tool


def known_tools() -> list[str]:
    """Return the registered tool names, sorted."""
    return sorted(_REGISTRY)


def make_tool(name: str, user: UserCode | None = None) -> Tool:
    """Return the tool registered as ``name``, or load ``"module:attr"`` (whose synchronous
    function, given ``user``, runs in its worker processes)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" not in name:
        raise ToolError(f"unknown tool {name!r}; known tools: {', '.join(known_tools())}")
    return _load_ref(name, user)


async def call_tool(tool: Tool, argument: str, ctx: ToolContext, timeout_s: float) -> ToolResult:
    """Call ``tool``, turning its exceptions and a timeout into ``ok=False`` results.

    Only SandboxError (the sandbox cannot start at all: a systemic fault) propagates.
    """
    try:
        return await asyncio.wait_for(tool(argument, ctx), timeout_s)
    except asyncio.TimeoutError:
        return ToolResult("", ok=False, error=f"timed out after {timeout_s:g}s")
    except SandboxError:
        raise
    except UserCodeError as exc:
        return ToolResult("", ok=False, error=str(exc))
    except Exception as exc:  # the per-call boundary: a crashing tool is data
        return ToolResult("", ok=False, error=f"{type(exc).__name__}: {exc}")


class FunctionTool:
    """Adapts ``f(argument: str) -> str`` (sync or async) to the Tool protocol; with ``user``,
    a sync ``f`` runs in one of its worker processes."""

    def __init__(
        self, name: str, fn: Callable[[str], str | Awaitable[str]], user: UserCode | None = None
    ) -> None:
        doc = inspect.getdoc(fn) or ""
        self.name = name
        self.description = doc.strip().splitlines()[0] if doc.strip() else name
        self._fn = fn
        self._user = user

    async def __call__(self, argument: str, ctx: ToolContext) -> ToolResult:
        if inspect.iscoroutinefunction(self._fn):
            out = await self._fn(argument)
        elif self._user is not None:  # cancelled by call_tool's timeout: the worker is killed
            out = await self._user.call(self._fn, (argument,), None, f"tool {self.name!r}")
        else:
            # A thread keeps a blocking function from stalling the loop (and call_tool's timeout).
            out = await asyncio.to_thread(self._fn, argument)
            if inspect.isawaitable(out):
                out = await out
        return ToolResult(str(out))

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"


def _load_ref(ref: str, user: UserCode | None) -> Tool:
    module_name, _, attr_path = ref.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
        for part in attr_path.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ToolError(f"cannot load tool {ref!r}: {type(exc).__name__}: {exc}") from exc
    if inspect.isclass(obj):
        try:
            obj = obj()
        except TypeError as exc:
            raise ToolError(f"tool class {ref!r} must take no arguments: {exc}") from exc
    if isinstance(obj, Tool):
        return obj
    if callable(obj):
        return FunctionTool(ref, obj, user)  # type: ignore[arg-type]
    raise ToolError(f"tool ref {ref!r} names {type(obj).__name__}, not a Tool or function")
