"""Run a graph over many examples concurrently and score each trajectory.

All executions share one backend, whose batcher turns the concurrency here into large batched
model calls. ``ExecContext.concurrency`` bounds executions in flight across every caller (and
so memory), not the model's batch size.

The search scores candidates through an ``Evaluator``: ``LocalEvaluator`` runs them here;
``evoagent.distributed`` spreads them over Ray actors that each hold a backend.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from evoagent.execute.executor import ExecContext, execute
from evoagent.execute.trajectory import Trajectory
from evoagent.graph.model import AgentGraph
from evoagent.llm.types import Usage
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

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory], version: int, seconds: float) -> Evaluation:
        """The evaluation made of these scored trajectories."""
        n = len(trajectories)
        return cls(
            score=sum(t.reward or 0.0 for t in trajectories) / n if n else 0.0,
            n=n,
            weights_version=version,
            tokens=sum(t.completion_tokens for t in trajectories),
            seconds=seconds,
            trajectories=list(trajectories),
        )

    @property
    def failures(self) -> list[Trajectory]:
        return [t for t in self.trajectories if (t.reward or 0.0) < 1.0]

    @property
    def successes(self) -> list[Trajectory]:
        return [t for t in self.trajectories if (t.reward or 0.0) >= 1.0]


async def run_and_score(
    graph: AgentGraph, example: Example, ctx: ExecContext, reward: RewardConfig, sample: int = 0
) -> Trajectory:
    """One execution plus its reward (0 with the reason when the execution or reward failed).

    An environment episode scores itself (``env_reward``); otherwise the task's reward judges
    the output. A failed reward also marks the sample ``skip="reward"`` for RL.
    """
    traj = await execute(graph, example, ctx, sample)
    if traj.error is not None:
        traj.reward = 0.0
    elif traj.env_reward is not None:
        traj.reward = traj.env_reward
    else:
        traj.reward, traj.error, traj.feedback = await score(
            traj.output, example, reward, ctx.user, ctx.tool_ctx.sandbox
        )
        if traj.error is not None:
            traj.skip = "reward"
    return traj


async def rollout(
    jobs: Sequence[tuple[AgentGraph, Example, int]],
    ctx: ExecContext,
    reward: RewardConfig,
    on_done: Callable[[], None] | None = None,
) -> list[Trajectory]:
    """Run and score every ``(graph, example, sample)`` at once, in order of ``jobs``.

    How many run at the same time is bounded by ``ctx``'s gate, shared by every caller.
    """

    async def one(job: tuple[AgentGraph, Example, int]) -> Trajectory:
        traj = await run_and_score(job[0], job[1], ctx, reward, job[2])
        if on_done is not None:
            on_done()
        return traj

    return list(await asyncio.gather(*(one(j) for j in jobs)))


async def evaluate(
    graph: AgentGraph,
    examples: Sequence[Example],
    ctx: ExecContext,
    reward: RewardConfig,
    on_done: Callable[[], None] | None = None,
) -> Evaluation:
    """Mean reward of ``graph`` over ``examples`` (one execution each)."""
    version = ctx.llm.weights_version
    start = time.perf_counter()
    trajs = await rollout([(graph, ex, 0) for ex in examples], ctx, reward, on_done)
    return Evaluation.of(trajs, version, time.perf_counter() - start)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of Chen et al. (2021): the chance that k of ``n`` samples, ``c`` of
    them correct, hold at least one correct one, ``1 - C(n-c, k) / C(n, k)``, computed as a
    product so large ``n`` does not overflow."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n samples, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    out = 1.0
    for i in range(n - c + 1, n + 1):
        out *= 1.0 - k / i
    return 1.0 - out


async def sampled_pass_at_k(
    graph: AgentGraph, examples: Sequence[Example], ctx: ExecContext, reward: RewardConfig,
    samples: int, ks: Sequence[int], temperature: float,
) -> dict[int, float]:
    """pass@k of ``graph`` averaged over ``examples``, from ``samples`` executions of each at
    ``temperature`` (every node samples; a reward of 1 passes): for agents that sample, where
    pass@1 of one greedy run says little."""
    hot = replace(ctx, temperature=temperature)
    trajs = await rollout([(graph, ex, s) for ex in examples for s in range(samples)], hot, reward)
    passed = [sum((t.reward or 0.0) >= 1.0 for t in trajs[i : i + samples]) for i in range(0, len(trajs), samples)]
    return {k: sum(pass_at_k(samples, c, k) for c in passed) / len(passed) for k in ks}


OnDone = Callable[[], None] | None


class Evaluator(Protocol):
    """Scores graphs for the search. ``evaluate`` returns one trajectory per example, in order,
    scored under the current weights version; a failing backend raises ``BackendError``.
    ``sync`` is told after weights changed (the trainable state dict and its version), so an
    evaluator whose backends live elsewhere can load them; ``usage`` is what those backends
    generated (the budget counts it with this process's)."""

    async def evaluate(self, graph: AgentGraph, examples: Sequence[Example], on_done: OnDone = None) -> Evaluation: ...

    async def sync(self, weights: dict[str, Any], version: int) -> None: ...

    def usage(self) -> Usage: ...

    async def aclose(self) -> None: ...


@dataclass
class LocalEvaluator:
    """Evaluates in this process on ``ctx``'s backend (which RL already trains in place)."""

    ctx: ExecContext
    reward: RewardConfig

    async def evaluate(self, graph: AgentGraph, examples: Sequence[Example], on_done: OnDone = None) -> Evaluation:
        return await evaluate(graph, examples, self.ctx, self.reward, on_done)

    async def sync(self, weights: dict[str, Any], version: int) -> None:
        return None

    def usage(self) -> Usage:
        """Nothing beyond the policy backend's own count: it is this process's."""
        return Usage()

    async def aclose(self) -> None:
        return None

