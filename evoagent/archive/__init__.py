"""The archive: the run's only state (SQLite)."""

from evoagent.archive.records import AgentRecord, EvalRecord, GenerationWrite
from evoagent.archive.store import Archive

__all__ = ["AgentRecord", "Archive", "EvalRecord", "GenerationWrite"]
