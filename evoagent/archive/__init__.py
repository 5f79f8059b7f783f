"""The archive: the run's only state (SQLite)."""

from evoagent.archive.store import AgentRecord, Archive, EvalRecord, GenerationWrite

__all__ = ["AgentRecord", "Archive", "EvalRecord", "GenerationWrite"]
