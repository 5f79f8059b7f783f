"""Tools a ReAct node can call, the registry that names them, and the Python sandbox.

Importing this package registers the built-ins: ``calculator`` and ``python``.
"""

from __future__ import annotations

from evoagent.tools import calculator as _calculator  # noqa: F401  (registers "calculator")
from evoagent.tools import python_tool as _python_tool  # noqa: F401  (registers "python")
from evoagent.tools.base import (
    FunctionTool,
    Tool,
    ToolContext,
    ToolResult,
    call_tool,
    known_tools,
    make_tool,
    register_tool,
)
from evoagent.tools.sandbox import SandboxConfig, SandboxResult, check_sandbox, run_python

__all__ = [
    "FunctionTool",
    "SandboxConfig",
    "SandboxResult",
    "Tool",
    "ToolContext",
    "ToolResult",
    "call_tool",
    "check_sandbox",
    "known_tools",
    "make_tool",
    "register_tool",
    "run_python",
]
