"""The one exception tree of evoagent.

    EvoagentError
    ├── SpecError        a task.yaml or graph file is malformed; names the field path
    ├── GraphError       an agent graph is invalid (cycle, missing node, unknown placeholder)
    ├── BackendError     a model backend cannot be built or fails as a whole
    ├── ToolError        an unknown tool, or a tool call that failed
    │   └── SandboxError the sandbox cannot start (bubblewrap missing, bad policy)
    ├── MutationError    an operator rejects its parents (the child is archived as invalid)
    ├── ArchiveError     the run directory is not a usable archive, or is locked by another run
    ├── RLError          training cannot proceed (no trainable policy, bad checkpoint)
    └── UserCodeError    the user's reward, tool or operator raised, hung (killed) or died

A per-example failure (garbage output, a tool that crashes on one input) is data, stored on the
trajectory; only systemic faults raise.
"""

from __future__ import annotations


class EvoagentError(Exception):
    """Base of every error evoagent raises on purpose."""


class SpecError(EvoagentError):
    """A task spec or graph file is malformed; the message names the field path."""


class GraphError(EvoagentError):
    """An agent graph is invalid; the message names the node or edge."""


class BackendError(EvoagentError):
    """A model backend cannot be built or failed as a whole."""


class ToolError(EvoagentError):
    """An unknown tool, or a tool call that failed."""


class SandboxError(ToolError):
    """The sandbox cannot run code at all (not: the code inside it failed)."""


class MutationError(EvoagentError):
    """An operator could not produce a valid child from these parents."""


class ArchiveError(EvoagentError):
    """The run directory is not a usable archive, or another run holds its lock."""


class RLError(EvoagentError):
    """Training cannot proceed."""


class UserCodeError(EvoagentError):
    """The user's function failed in its worker process; the message says how. Per-candidate
    data (a reward scores 0, a tool call fails, an operator's child is archived as crashed)."""
