"""The tool registry: names, "module:function" refs, and call_tool's never-raise boundary."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from evoagent.errors import ToolError
from evoagent.tools import (
    Tool,
    ToolContext,
    ToolResult,
    call_tool,
    known_tools,
    make_tool,
    register_tool,
)

CTX = ToolContext()


def test_builtins_are_registered() -> None:
    assert {"calculator", "python"} <= set(known_tools())
    assert isinstance(make_tool("calculator"), Tool)


def test_unknown_tool_error_lists_known_tools() -> None:
    with pytest.raises(ToolError) as info:
        make_tool("abacus")
    message = str(info.value)
    assert "abacus" in message and "calculator" in message and "python" in message


def _write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_module_function_ref_wraps_sync_and_async_functions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_module(
        tmp_path,
        monkeypatch,
        "mytools_ok",
        '''
def shout(argument: str) -> str:
    """Upper-cases its argument.

    More text that is not shown."""
    return argument.upper()

async def reverse(argument):
    return argument[::-1]
''',
    )
    shout = make_tool("mytools_ok:shout")
    assert shout.name == "mytools_ok:shout"
    assert shout.description == "Upper-cases its argument."
    assert asyncio.run(call_tool(shout, "hi", CTX, 5)) == ToolResult("HI")
    reverse = make_tool("mytools_ok:reverse")
    assert asyncio.run(call_tool(reverse, "abc", CTX, 5)) == ToolResult("cba")


@pytest.mark.parametrize("ref", ["no_such_module_xyz:f", "mytools_bad:missing"])
def test_bad_module_ref_names_the_ref(
    ref: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_module(tmp_path, monkeypatch, "mytools_bad", "X = 1\n")
    with pytest.raises(ToolError, match=ref):
        make_tool(ref)


def test_raising_tool_gives_not_ok_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_module(
        tmp_path, monkeypatch, "mytools_raise", "def boom(a):\n    raise RuntimeError('kaput')\n"
    )
    result = asyncio.run(call_tool(make_tool("mytools_raise:boom"), "x", CTX, 5))
    assert result == ToolResult("", ok=False, error="RuntimeError: kaput")


def test_hanging_async_tool_times_out() -> None:
    class Hang:
        name = "hang"
        description = "never answers"

        async def __call__(self, argument: str, ctx: ToolContext) -> ToolResult:
            await asyncio.sleep(60)
            return ToolResult("never")

    start = time.monotonic()
    result = asyncio.run(call_tool(Hang(), "x", CTX, 0.2))
    assert time.monotonic() - start < 5
    assert not result.ok and result.error == "timed out after 0.2s"


def test_register_tool_decorates_a_class_and_rejects_a_clash() -> None:
    @register_tool
    class Echo:
        name = "test-echo"
        description = "echoes"

        async def __call__(self, argument: str, ctx: ToolContext) -> ToolResult:
            return ToolResult(argument)

    assert "test-echo" in known_tools()
    assert asyncio.run(call_tool(make_tool("test-echo"), "yo", CTX, 5)) == ToolResult("yo")

    class Other:
        name = "test-echo"
        description = "a different tool under the same name"

        async def __call__(self, argument: str, ctx: ToolContext) -> ToolResult:
            return ToolResult("")

    with pytest.raises(ToolError, match="already registered"):
        register_tool(Other())
    with pytest.raises(ToolError, match="not a Tool"):
        register_tool(object())
