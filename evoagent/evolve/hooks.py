"""What the search loop talks to besides the archive: a progress sink, the inner RL loop, and
what a finished search returns. Kept apart so ``loop.py`` holds the orchestration alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from evoagent.execute.trajectory import Trajectory
from evoagent.graph import AgentGraph
from evoagent.tasks.datasets import Example


class Reporter(Protocol):
    """Progress sink (the CLI draws rich bars); every method is optional to act on."""

    def stage(self, name: str, total: int) -> None: ...

    def advance(self) -> None: ...

    def log(self, message: str) -> None: ...

    def search(self, generation: int, total: int, summary: str) -> None:
        """The search as a whole: ``generation`` of ``total`` committed; ``summary`` says the
        best score and the cost so far."""


class NullReporter:
    def stage(self, name: str, total: int) -> None: ...

    def advance(self) -> None: ...

    def log(self, message: str) -> None: ...

    def search(self, generation: int, total: int, summary: str) -> None: ...


class RLHook(Protocol):
    """What the loop needs from the inner RL loop (``evoagent.rl.phase.RLPhase``)."""

    async def train(
        self, elite: Sequence[AgentGraph], train: Sequence[Example], generation: int,
        on_step: Callable[[], None] | None = None, reserve: Sequence[AgentGraph] = (),
        reused: Sequence[Trajectory] = (),
    ) -> RLPhaseResult: ...

    def restore(self, path: str, version: int) -> None: ...

    def rollback(self, path: str | None, version: int) -> None:
        """Serve ``version``'s weights again after a phase that hurt: the checkpoint at ``path``,
        or with None the weights before any phase."""

    def weights(self) -> dict[str, Any]:
        """The trained weights now served (what a checkpoint stores), for remote evaluators."""


class RLPhaseResult(Protocol):
    """An RL phase's checkpoint path, metrics and rollouts (``evoagent.rl.phase.PhaseResult``)."""

    checkpoint: str
    metrics: dict[str, Any]
    rollouts: list[Trajectory]
    archive: bool


@dataclass
class SearchResult:
    run_dir: Path
    best_id: str
    best_val: float
    seed_val: float
    test: float | None
    weights_version: int
    generations: int
    calls: int = 0  # completions the models generated before the test (cache hits excluded)
    tokens: int = 0
