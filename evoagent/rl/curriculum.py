"""A self-evolving curriculum for the RL phase, after WebRL (Qi et al. 2025).

Two parts, both read from and kept in the archive (so ``--resume`` goes on as the run would):

- **Which inputs.** A GRPO group whose samples all score alike teaches nothing; the inputs the
  elite solve sometimes but not always are where the signal is. With ``rl.curriculum.enabled``
  the phase's rollouts are archived, each train input's success rate is read back, and a step
  draws its inputs (without replacement) with weight ``focus`` for a rate strictly between 0
  and 1, 1 for an input never tried, ``1/focus`` for one always or never solved.
- **How hard.** ``rl.curriculum.levels`` lists harder generator options; once a phase's rollout
  accuracy reaches ``promote_at``, the train split is drawn again one level up (the val and test
  splits never change, so scores stay comparable). The level is written with the generation.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path

from evoagent.execute.trajectory import Trajectory
from evoagent.rl.config import CurriculumConfig
from evoagent.spec.config import DatasetConfig
from evoagent.tasks.datasets import Example, load_examples

LEVEL_KEY = "curriculum_level"  # the archive's meta key


def success_rates(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Each input's share of solved executions (reward 1) among ``trajectories``."""
    seen: dict[str, list[float]] = {}
    for t in trajectories:
        if t.skip is None:
            seen.setdefault(t.input_id, []).append(float((t.reward or 0.0) >= 1.0))
    return {k: sum(v) / len(v) for k, v in seen.items()}


def draw_inputs(
    train: Sequence[Example], n: int, rates: dict[str, float], cfg: CurriculumConfig, rng: random.Random,
) -> list[Example]:
    """``n`` distinct inputs, weighted by the elite's record on them (module docstring);
    Efraimidis-Spirakis keys, so the draw is one pass and seeded by ``rng``."""

    def weight(ex: Example) -> float:
        r = rates.get(ex.id)
        return 1.0 if r is None else cfg.focus if 0.0 < r < 1.0 else 1.0 / cfg.focus

    keyed = sorted(((rng.random() ** (1.0 / weight(ex)), i) for i, ex in enumerate(train)), reverse=True)
    return [train[i] for _, i in keyed[:n]]


def next_level(level: int, accuracy: float, cfg: CurriculumConfig) -> int:
    """The level the next phase trains at."""
    return level + 1 if level < len(cfg.levels) and accuracy >= cfg.promote_at else level


def train_at(level: int, dataset: DatasetConfig, cfg: CurriculumConfig, size: int, seed: int,
             base_dir: Path, avoid: Collection[str] = ()) -> list[Example]:
    """The train split at ``level`` (>= 1): ``size`` fresh examples of the task's generator with
    that level's options, none of whose questions is in ``avoid`` (the val and test questions,
    and ``splits.exclude``'s); ids carry the level, so archived records never mix levels."""
    options = {**dataset.options, **cfg.levels[level - 1]}
    drawn = size
    while True:
        examples = load_examples(dataset.model_copy(update={"options": options, "size": drawn}),
                                 seed + 7919 * level, base_dir)
        kept = [ex for ex in examples if ex.input not in avoid]
        if len(kept) >= size or drawn >= 8 * size:  # a generator this small gives what it has
            return [replace(ex, id=f"L{level}-{ex.id}") for ex in kept[:size]]
        drawn *= 2
