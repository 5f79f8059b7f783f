"""The ``python`` tool: run the argument as a Python program in the sandbox, return its stdout.

The LLM often wraps code in markdown fences; the first fenced block is used if there is one.
Isolation and limits are whatever ``ctx.sandbox`` says (see ``evoagent.tools.sandbox``).
"""

from __future__ import annotations

import re

from evoagent.tools.base import ToolContext, ToolResult, register_tool
from evoagent.tools.sandbox import run_python

MAX_OUTPUT_CHARS = 2000
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def program(source: str, argument: str) -> str:
    """The program a tool node with its own ``source`` runs: the source, then ``main`` on the
    argument (as a Python literal: no quoting can break out of it), its result printed."""
    return f"{source}\n\nprint(main({argument!r}))\n"


def strip_fences(text: str) -> str:
    """Return the first ```python fenced block of ``text``, or ``text`` itself if none."""
    match = _FENCE.search(text)
    return match.group(1) if match else text


@register_tool
class PythonTool:
    """Runs Python code in the sandbox; the observation is what it prints."""

    name = "python"
    description = "runs a Python program in a sandbox and returns what it prints, e.g. print(2**10)"

    async def __call__(self, argument: str, ctx: ToolContext) -> ToolResult:
        result = await run_python(strip_fences(argument), ctx.sandbox)
        output = result.stdout.strip()[:MAX_OUTPUT_CHARS]
        if not result.ok:
            return ToolResult(output, ok=False, error=f"{result.status}: {result.reason}")
        return ToolResult(output)
