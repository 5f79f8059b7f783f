"""Multi-turn text environments that a ``loop`` node with ``env:`` plays, one episode per input.

An environment is a registry entry ``fn(example) -> Episode``: the example says which game and
seed (the ``textarena`` dataset kind writes ``meta = {"env_id", "seed"}``), the episode answers
actions with observations and ends with a score in [0, 1]. The episode's score is the
trajectory's reward (the task's ``reward`` section is not consulted for it), so games with their
own partial credit (FrozenLake's share of the way to the goal, Sokoban's boxes on goals) give
GRPO a signal even when no episode is won.

Built in: ``textarena`` (the single-player games of textarena 0.7.4 that run offline). Add one
with ``@environment("name")``.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from typing import Any, Protocol

from evoagent.errors import SpecError
from evoagent.registry import Registry
from evoagent.spec.config import DatasetConfig
from evoagent.tasks.datasets import Example, dataset


class Episode(Protocol):
    """One running game. Calls may block (the executor runs them in a worker thread)."""

    def observation(self) -> str:
        """What the player sees before its first action."""
        ...

    def step(self, action: str) -> tuple[str, bool]:
        """Play ``action`` (the model's whole reply); return (what the player sees now, done)."""
        ...

    def score(self) -> float:
        """The episode's score in [0, 1], final or partial when the turn budget ran out."""
        ...


EnvFactory = Callable[[Example], Episode]
_GLOBAL_RANDOM = threading.Lock()  # textarena's games share the ``random`` module's state
_REGISTRY: Registry[EnvFactory] = Registry("environment", SpecError, field="loop node env")
environment = _REGISTRY.register  # ``@environment("name")``: register ``fn(example) -> Episode``
known_environments = _REGISTRY.names


def make_episode(name: str, example: Example) -> Episode:
    """A fresh episode of environment ``name`` for ``example``."""
    return _REGISTRY.get(name)(example)


class TextArenaEpisode:
    """A textarena single-player game, seeded by the example.

    Observations after the first keep only what changed: the ``-train`` wrappers repeat the
    rules before every board, which would fill a small model's context in a few turns. The
    score is the game's reward when it ended (win 1, otherwise its own partial credit), and the
    game's partial-credit function when the loop's turn budget ended it first. Without
    ``partial_credit`` only a win scores (1, else 0): the sparse reward of a goal.
    """

    def __init__(self, env_id: str, seed: int, partial_credit: bool = True) -> None:
        import textarena as ta

        self.partial_credit = partial_credit

        self.env = ta.make(env_id)
        self._rng: Any = None
        self._own_rng(lambda: self.env.reset(num_players=1, seed=seed))
        self.first = self.env.get_observation()[1]
        self.rewards: dict[int, float] | None = None
        self.done = False

    def _own_rng(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` on this episode's own stream of the global ``random`` module.

        textarena seeds and draws from the process-wide ``random`` (``reset`` calls
        ``random.seed``). Episodes run in worker threads at once, so without this their
        draws would interleave (the same seed, another board) and reseed everyone else's.
        """
        with _GLOBAL_RANDOM:
            outside = random.getstate()
            try:
                if self._rng is not None:
                    random.setstate(self._rng)
                return call()
            finally:
                self._rng = random.getstate()
                random.setstate(outside)

    def observation(self) -> str:
        return self.first

    def step(self, action: str) -> tuple[str, bool]:
        if self.done:
            return "The game is over.", True
        self.done, _ = self._own_rng(lambda: self.env.step(action=action))
        if self.done:
            self.rewards, info = self.env.close()
            reason = next(iter(info.values()), {}).get("reason", "") if info else ""
            return f"Game over. {reason}".strip(), True
        return _new_part(self.first, self.env.get_observation()[1]), False

    def score(self) -> float:
        if self.rewards:
            value = float(next(iter(self.rewards.values())))
            if not self.partial_credit:
                value = float(value >= 1.0)
        elif not self.partial_credit:
            value = 0.0
        else:
            partial: Any = getattr(self.env.unwrapped, "_get_percentage_completion", None)
            value = float(partial()) if callable(partial) else 0.0
        return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0


def _new_part(first: str, now: str) -> str:
    """``now`` without the lines it shares with the start of ``first`` (the repeated rules)."""
    a, b = first.splitlines(), now.splitlines()
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return "\n".join(b[n:]).strip() or now


@environment("textarena")
def _textarena(example: Example) -> Episode:
    try:
        return TextArenaEpisode(str(example.meta["env_id"]), int(example.meta["seed"]),
                                bool(example.meta.get("partial_credit", True)))
    except KeyError as e:
        raise SpecError(
            f"env textarena: example {example.id!r} has no {e} in its meta "
            "(use task.dataset.kind: textarena)"
        ) from None


@dataset("textarena")
def _textarena_games(cfg: DatasetConfig, seed: int, base_dir: Any) -> list[Example]:
    """``size`` seeded games of ``name`` (e.g. FrozenLake-v0-train); the input is the first
    observation, so the usual splits and templates apply. Seeds start at ``seed * 100_000``.
    Option ``partial_credit: false`` scores a win 1 and anything else 0."""
    try:
        import textarena as ta
    except ImportError:
        raise SpecError(
            "task.dataset.kind: textarena needs the textarena package (pip install textarena)"
        ) from None
    if cfg.name is None:
        raise SpecError("task.dataset.name: required for kind textarena (e.g. FrozenLake-v0-train)")
    try:
        ta.make(cfg.name)
    except Exception as e:  # textarena raises plain ValueError/LookupError/ImportError
        raise SpecError(
            f"task.dataset.name: textarena cannot make {cfg.name!r} offline: {type(e).__name__}: {e}"
        ) from None
    if unknown := set(cfg.options) - {"partial_credit"}:
        raise SpecError(f"task.dataset.options: textarena knows only 'partial_credit', not {sorted(unknown)}")
    partial = cfg.options.get("partial_credit", True)
    if not isinstance(partial, bool):
        raise SpecError(f"task.dataset.options.partial_credit: true or false, not {partial!r}")
    out = []
    for k in range(cfg.size):
        s = seed * 100_000 + k
        first = TextArenaEpisode(cfg.name, s).observation()
        meta = {"env_id": cfg.name, "seed": s, "partial_credit": partial}
        out.append(Example(f"{cfg.name}-{s}", first, "", meta))
    return out
