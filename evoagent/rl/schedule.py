"""When the joint loop trains the weights: ``rl.schedule``, chosen after each search generation.

Every step of a run is a search generation or an RL phase. The loop writes each finished step
to the archive as a ``Step``: what it cost, in completions asked of the models (cache hits
included, so a resumed run, whose cache starts empty, counts the same), and what it gained, as
the best val score after it minus the best before, under the weights that follow it. A schedule
reads that record and says whether an RL phase follows the search generation that just ended. The record is the only state, so a resumed run decides exactly as the killed one
would have.

- ``fixed``: a phase every ``rl.every`` generations, whatever it gained.
- ``adaptive``: a discounted two-armed bandit on gain per completion (discounted UCB, Garivier
  and Moulines 2011). The first phase comes after ``rl.every`` generations; after that, RL
  follows a generation when its discounted gain per completion, plus an exploration bonus,
  beats the search's. The discount forgets old steps, so an arm that stopped paying (RL once
  the model has learned what it can, or the search once it has plateaued) loses its lead. An
  arm not played recently has a small discounted count and a growing bonus, so RL that once
  hurt is retried, rarely, in case the agents it trains on have since changed.

Whatever the schedule, the loop itself never lets a phase be the last step (``loop.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

from evoagent.errors import SpecError
from evoagent.registry import Registry

SEARCH = "search"
RL = "rl"
STEPS_KEY = "schedule_steps"  # the archive's meta key of the run's list of steps


@dataclass(frozen=True)
class Step:
    """One finished step of the run as the schedule sees it.

    ``gain``: the best val after the step minus the best before, both under the weights that
    follow it (an RL phase's: the top agents re-scored under the new weights, against their best
    before). ``kept``: False for a phase whose weights were rolled back; its measured gain stays
    on record, so the schedule learns from the harm it did.
    """

    generation: int
    kind: Literal["search", "rl"]
    requests: int
    gain: float
    kept: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Step:
        return cls(**d)


class Meta(Protocol):
    """What ``recorded`` reads: an archive's meta values (``Archive.meta``)."""

    def meta(self, key: str) -> Any: ...


def recorded(archive: Meta) -> list[Step]:
    """Every finished step of a run, as its archive recorded them."""
    return [Step.from_json(d) for d in archive.meta(STEPS_KEY) or []]


class Schedule(Protocol):
    """Decides, after search generation ``generation``, whether an RL phase follows it."""

    def wants_rl(self, generation: int, steps: Sequence[Step]) -> bool: ...


ScheduleFactory = Callable[[int, float, float], Schedule]  # (every, discount, explore)
_REGISTRY: Registry[ScheduleFactory] = Registry("schedule", SpecError, field="rl.schedule")
known_schedules = _REGISTRY.names


def make_schedule(name: str, every: int, discount: float, explore: float) -> Schedule:
    """The schedule registered as ``name`` (``rl.schedule``)."""
    return _REGISTRY.get(name)(every, discount, explore)


@dataclass(frozen=True)
class Fixed:
    """A phase every ``every`` generations."""

    every: int

    def wants_rl(self, generation: int, steps: Sequence[Step]) -> bool:
        return generation % self.every == 0


@dataclass(frozen=True)
class Adaptive:
    """Discounted UCB over the two kinds of step, on gain per completion.

    An arm's value is its discounted gain over its discounted cost (a ratio of sums, so a cheap
    lucky step does not dominate an expensive one). Its bonus is ``explore`` times the largest
    gain per completion any step has shown, times sqrt(log(n) / n_arm) with n the discounted
    count of all steps: the same units as the value, so the setting means the same on any task.
    Ties go to search: a phase has to show that it pays.
    """

    every: int
    discount: float
    explore: float

    def wants_rl(self, generation: int, steps: Sequence[Step]) -> bool:
        if not any(s.kind == RL for s in steps):
            return generation >= self.every  # warm-up: the search sets the rate to beat
        values = {kind: self._value(kind, steps) for kind in (SEARCH, RL)}
        return values[RL] > values[SEARCH]

    def _value(self, kind: str, steps: Sequence[Step]) -> float:
        weights = [self.discount ** (len(steps) - 1 - i) for i in range(len(steps))]
        mine = [(w, s) for w, s in zip(weights, steps, strict=True) if s.kind == kind]
        count = sum(w for w, _ in mine)
        if count == 0:
            return math.inf
        rate = sum(w * s.gain for w, s in mine) / max(sum(w * s.requests for w, s in mine), 1)
        scale = max((abs(s.gain) / max(s.requests, 1) for s in steps), default=0.0)
        bonus = self.explore * scale * math.sqrt(max(math.log(sum(weights)), 0.0) / count)
        return rate + bonus


_REGISTRY.add("fixed", lambda every, discount, explore: Fixed(every))
_REGISTRY.add("adaptive", Adaptive)
