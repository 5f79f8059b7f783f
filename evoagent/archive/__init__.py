"""The archive: the run's only state (SQLite)."""

from evoagent.archive.store import Archive, AgentRecord, EvalRecord, GenerationWrite

__all__ = ["AgentRecord", "Archive", "EvalRecord", "GenerationWrite"]
