"""What RL adds to a task's reward while it trains, and never when an agent is scored.

``overlong``: DAPO's soft overlong punishment (Yu et al. 2025, eq. 13). An episode whose
completions stay within ``max_tokens - buffer`` tokens keeps its reward; inside the last
``buffer`` tokens the penalty grows linearly from 0 to 1; past ``max_tokens`` it is the full 1.
A truncated answer is then told apart from a wrong one of sensible length, without the reward
noise of scoring every cut-off episode as a plain failure.

``exploration``: a bonus for reaching observations the policy has seen rarely, so that the
groups of an environment whose goal no sample reaches yet (FrozenLake early on) still differ
and give a gradient, towards the unvisited states (count-based exploration: Strehl & Littman
2008; Bellemare et al. 2016; DigiRL and AMAGO train agents whose rewards are this sparse). The
observation keys are GiGPO's anchors: the node and a hash of what it was shown. Kinds are a
registry (``@explorer("name")``); the counts live in the archive, so a resumed run gives the
bonuses the uninterrupted one would.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evoagent.errors import SpecError
from evoagent.execute.trajectory import Trajectory
from evoagent.registry import Registry

EXPLORATION_KEY = "exploration_counts"  # the archive's meta key of an explorer's state


class OverlongConfig(BaseModel):
    """DAPO's soft overlong punishment (rl/shaping.py): the reward RL trains on loses up to 1
    as an episode's completion tokens enter the last ``buffer`` before ``max_tokens``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(ge=1, description="completion tokens of an episode (all its llm steps) "
                            "beyond which the whole penalty of 1 applies")
    buffer: int = Field(ge=1, description="the last tokens before max_tokens over which the "
                        "penalty rises linearly from 0 to 1")

    @model_validator(mode="after")
    def _buffer_fits(self) -> OverlongConfig:
        if self.buffer > self.max_tokens:
            raise ValueError(f"buffer: {self.buffer} is larger than max_tokens {self.max_tokens}; "
                             "the penalty starts max_tokens - buffer tokens in")
        return self


def overlong_penalty(tokens: int, cfg: OverlongConfig) -> float:
    """The (non-positive) amount added to the reward of an episode of ``tokens`` completion
    tokens, all of its llm steps together."""
    soft = cfg.max_tokens - cfg.buffer
    if tokens <= soft:
        return 0.0
    if tokens <= cfg.max_tokens:
        return (soft - tokens) / cfg.buffer
    return -1.0


class ExplorationConfig(BaseModel):
    """An exploration bonus on the reward RL trains on (rl/shaping.py), never on scoring."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field("count", description="rl.shaping explorer key: 'count', beta / sqrt(visits) "
                      "of each observation (node and what it was shown) an episode reached")
    beta: float = Field(0.1, gt=0, description="the bonus of a never-seen observation")

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        if v not in known_explorers():
            raise ValueError(f"unknown exploration kind {v!r}; known: {known_explorers()}")
        return v


class Explorer(Protocol):
    """An exploration bonus: sees every RL episode, then says what each one earns on top of
    its reward. Its state is plain JSON, kept in the archive with the phase that changed it."""

    def observe(self, episodes: Sequence[Trajectory]) -> None: ...

    def bonus(self, episodes: Sequence[Trajectory]) -> list[float]: ...

    def state(self) -> dict[str, int]: ...

    def load(self, state: Mapping[str, int]) -> None: ...


_EXPLORERS: Registry[Callable[[float], Explorer]] = Registry("exploration", SpecError, field="rl.exploration.kind")
explorer = _EXPLORERS.register  # ``@explorer("name")``: register ``cls(beta) -> Explorer``
known_explorers = _EXPLORERS.names


def make_explorer(kind: str, beta: float) -> Explorer:
    """The explorer registered as ``kind``, scaled by ``beta``."""
    return _EXPLORERS.get(kind)(beta)


@explorer("count")
class CountBonus:
    """``beta / sqrt(N(s))`` for each observation ``s`` an episode's llm steps saw, averaged
    over those steps, where ``N`` counts every RL episode's visits so far, this step's
    included. An episode that reaches a state no one has seen earns up to ``beta``; one that
    walks the usual path earns little, and less every phase."""

    def __init__(self, beta: float) -> None:
        self.beta = beta
        self.counts: dict[str, int] = {}

    def observe(self, episodes: Sequence[Trajectory]) -> None:
        for t in episodes:
            for s in t.llm_steps:
                self.counts[s.anchor] = self.counts.get(s.anchor, 0) + 1

    def bonus(self, episodes: Sequence[Trajectory]) -> list[float]:
        out = []
        for t in episodes:
            seen = [self.counts.get(s.anchor, 0) for s in t.llm_steps]
            out.append(self.beta * sum(1 / math.sqrt(max(n, 1)) for n in seen) / len(seen) if seen else 0.0)
        return out

    def state(self) -> dict[str, int]:
        return dict(self.counts)

    def load(self, state: Mapping[str, int]) -> None:
        self.counts = {str(k): int(v) for k, v in state.items()}
