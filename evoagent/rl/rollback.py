"""Whether an RL phase hurt: a paired bootstrap over the val inputs (``rl.rollback``).

The agent that was best before the phase is scored on every val input before and after it, so
each input gives one paired difference. The phase hurt when the mean difference is below 0 in
at least ``confidence`` of the bootstrap's resamples of the inputs: a drop larger than the noise
of which inputs val happens to hold, not one input flipping by chance.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

DRAWS = 2000


@dataclass(frozen=True)
class Verdict:
    """``change``: mean after minus before over the paired inputs; ``p_drop``: the share of
    resamples whose mean change is below 0; ``hurt``: ``p_drop >= confidence``."""

    change: float
    p_drop: float
    inputs: int
    hurt: bool

    def describe(self) -> str:
        return (f"val change {self.change:+.3f} on {self.inputs} paired inputs, "
                f"below 0 in {self.p_drop:.0%} of bootstrap resamples")


def judge(before: Mapping[str, float], after: Mapping[str, float], confidence: float, seed: int) -> Verdict:
    """Compare per-input rewards of one agent before and after a phase, on the inputs both have."""
    ids = sorted(before.keys() & after.keys())
    if not ids:
        return Verdict(0.0, 0.0, 0, False)
    diff = np.array([after[i] - before[i] for i in ids], dtype=float)
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(ids), size=(DRAWS, len(ids)))].mean(axis=1)
    p_drop = float((means < 0).mean())
    return Verdict(float(diff.mean()), p_drop, len(ids), p_drop >= confidence)
