"""Run a graph over many examples concurrently and score each trajectory.

All executions share one backend, whose batcher turns the concurrency here into large batched
model calls. ``concurrency`` bounds executions in flight (and so memory), not model batch size.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from evoagent.execute.executor import ExecContext, execute
from evoagent.execute.trajectory import Trajectory
from evoagent.graph.model import AgentGraph
from evoagent.spec.config import RewardConfig
from evoagent.tasks.datasets import Example
from evoagent.tasks.rewards import score


@dataclass
class Evaluation:
    """Scores of one graph on some examples under one weights version."""

    score: float
    n: int
    weights_version: int
    tokens: int
    seconds: float
    trajectories: list[Trajectory] = field(repr=False, default_factory=list)

    @property
    def failures(self) -> list[Trajectory]:
        return [t for t in self.trajectories if (t.reward or 0.0) < 1.0]

    @property
    def successes(self) -> list[Trajectory]:
        return [t for t in self.trajectories if (t.reward or 0.0) >= 1.0]


async def run_and_score(
    graph: AgentGraph, example: Example, ctx: ExecContext, reward: RewardConfig, sample: int = 0
) -> Trajectory:
    """One execution plus its reward (0 with the reason when the execution or reward failed)."""
    traj = await execute(graph, example, ctx, sample)
    if traj.error is not None:
        traj.reward = 0.0
        return traj
    traj.reward, err = await score(traj.output, example, reward)
    traj.error = err
    return traj


async def evaluate(
    graph: AgentGraph,
    examples: Sequence[Example],
    ctx: ExecContext,
    reward: RewardConfig,
    concurrency: int = 64,
    samples: int = 1,
    on_done: Callable[[], None] | None = None,
) -> Evaluation:
    """Mean reward of ``graph`` over ``examples`` (``samples`` executions each)."""
    gate = asyncio.Semaphore(concurrency)
    version = ctx.llm.weights_version
    start = time.perf_counter()

    async def one(ex: Example, k: int) -> Trajectory:
        async with gate:
            traj = await run_and_score(graph, ex, ctx, reward, k)
        if on_done is not None:
            on_done()
        return traj

    trajs = await asyncio.gather(*(one(ex, k) for ex in examples for k in range(samples)))
    n = len(trajs)
    return Evaluation(
        score=sum(t.reward or 0.0 for t in trajs) / n if n else 0.0,
        n=n,
        weights_version=version,
        tokens=sum(t.completion_tokens for t in trajs),
        seconds=time.perf_counter() - start,
        trajectories=list(trajs),
    )
