"""``Pending``: one generation's writes, gathered in memory and committed in one transaction."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from evoagent.archive.records import AgentRecord, EvalRecord, GenerationWrite
from evoagent.evolve.insights import Insight
from evoagent.execute.evaluate import Evaluation
from evoagent.execute.trajectory import Trajectory


@dataclass
class Pending:
    """One generation's writes, accumulated in memory until the commit."""

    generation: int
    version: int
    agents: list[AgentRecord] = field(default_factory=list)
    evaluations: list[EvalRecord] = field(default_factory=list)
    trajectories: list[tuple[str, Trajectory, int]] = field(default_factory=list)
    # parents drawn with a score from older weights, re-scored under ``version`` (once each)
    rescored: dict[str, asyncio.Task[Evaluation]] = field(default_factory=dict)
    insights: list[Insight] | None = None  # the memory after this generation, if it changed
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. the curriculum level, if it moved

    def add_eval(self, agent_id: str, split_: str, stage: str, ev: Evaluation) -> None:
        self.evaluations.append(
            EvalRecord(agent_id, split_, stage, ev.weights_version, ev.score, ev.n, ev.tokens,
                       ev.seconds, self.generation)
        )

    def record(self, agent_id: str, split_: str, stage: str, ev: Evaluation) -> None:
        """An evaluation with its trajectories."""
        self.add_eval(agent_id, split_, stage, ev)
        self.trajectories.extend((split_, t, ev.weights_version) for t in ev.trajectories)

    def write(
        self, checkpoint: tuple[str, dict, int] | None = None, usage: tuple[int, int] | None = None
    ) -> GenerationWrite:
        memory = None if self.insights is None else [(i.text, i.votes) for i in self.insights]
        return GenerationWrite(self.generation, self.version, self.agents, self.evaluations,
                               self.trajectories, checkpoint, usage, memory, self.meta)
