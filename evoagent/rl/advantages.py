"""Turn episode rewards into per-step advantages, one registry entry per estimator.

Every estimator is a pure function ``(AdvantageInput, AdvantageConfig) -> Tensor (S,)``: it reads
the flattened episodes and returns one advantage per LLM step (one step = one completion that the
policy loss trains on). Episode-level estimators broadcast the episode's advantage to all of its
steps. Contract shared by all entries:

- a group whose returns are all equal gets exactly 0 (never NaN, whatever ``eps`` is); for
  ``gigpo`` this holds per level, so its step part can still be non-zero in such a group;
- a singleton group gets 0 (there is no baseline to compare against);
- inputs are not mutated; the output has the dtype and device of ``step_reward``.

Registered: ``grpo``, ``dr_grpo``, ``rloo``, ``gigpo``. Add one with ``@advantage("name")``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from evoagent.errors import RLError, SpecError
from evoagent.registry import Registry


@dataclass(frozen=True)
class AdvantageInput:
    """Episodes and their LLM steps, flattened. Steps are ordered by episode, then time.

    Attributes:
        episode_group: (E,) long: group id of each episode (same agent + same input = one group);
            ids need not be contiguous.
        step_episode: (S,) long: index of the episode (0..E-1) each step belongs to; non-decreasing.
        step_reward: (S,) float: immediate reward of the step (usually 0 except the last step,
            which carries the episode reward).
        step_anchor: (S,) long: anchor-state id; equal ids within one episode group are the same
            (graph node, observation hash) state (GiGPO). Ids are only compared inside a group.
    """

    episode_group: Tensor  # (E,)
    step_episode: Tensor  # (S,)
    step_reward: Tensor  # (S,)
    step_anchor: Tensor  # (S,)

    def __post_init__(self) -> None:
        if self.episode_group.dim() != 1:
            raise RLError(f"episode_group must be 1-D (E,), got {tuple(self.episode_group.shape)}")
        s = self.step_episode.shape
        if (
            self.step_episode.dim() != 1
            or self.step_reward.shape != s
            or self.step_anchor.shape != s
        ):
            raise RLError(
                "step_episode, step_reward, step_anchor must share one 1-D shape (S,), got "
                f"{tuple(s)}, {tuple(self.step_reward.shape)}, {tuple(self.step_anchor.shape)}"
            )
        if not self.step_reward.is_floating_point():
            raise RLError(f"step_reward must be a float tensor, got {self.step_reward.dtype}")
        if s[0] == 0:
            return
        e = self.episode_group.numel()
        if int(self.step_episode.min()) < 0 or int(self.step_episode.max()) >= e:
            raise RLError(f"step_episode must lie in 0..{e - 1}")
        if bool((self.step_episode[1:] < self.step_episode[:-1]).any()):
            raise RLError("steps must be ordered by episode (step_episode non-decreasing)")


@dataclass(frozen=True)
class AdvantageConfig:
    """Knobs of the advantage estimators.

    Attributes:
        eps: added to the group std before dividing (DeepSeekMath GRPO); 0 is allowed.
        gamma: GiGPO step discount for the step return G_t (Feng et al. 2025, Eq. 5).
        omega: GiGPO weight of the step-level advantage in A = A_episode + omega * A_step.
        gigpo_norm: GiGPO's F_norm for both levels: "mean" (F_norm = 1, the paper's default)
            or "std" (divide by the group std + eps).
    """

    eps: float = 1e-6
    gamma: float = 0.95
    omega: float = 1.0
    gigpo_norm: Literal["mean", "std"] = "mean"

    def __post_init__(self) -> None:
        if self.eps < 0:
            raise SpecError(f"AdvantageConfig.eps: must be >= 0, got {self.eps}")
        if not 0.0 <= self.gamma <= 1.0:
            raise SpecError(f"AdvantageConfig.gamma: must lie in [0, 1], got {self.gamma}")
        if self.gigpo_norm not in ("mean", "std"):
            raise SpecError(
                "AdvantageConfig.gigpo_norm: must be one of ['mean', 'std'], "
                f"got {self.gigpo_norm!r}"
            )


AdvantageFn = Callable[[AdvantageInput, AdvantageConfig], Tensor]  # -> (S,) per-step advantages

_REGISTRY: Registry[AdvantageFn] = Registry("advantage", RLError)
advantage = _REGISTRY.register  # ``@advantage("name")``: register an estimator (a name once)
get_advantage = _REGISTRY.get  # an unknown name raises RLError listing the known ones
known_advantages = _REGISTRY.names


def episode_returns(inp: AdvantageInput) -> Tensor:
    """(E,) undiscounted sum of step rewards per episode; an episode without steps returns 0."""
    e = inp.episode_group.numel()
    out = torch.zeros(e, dtype=inp.step_reward.dtype, device=inp.step_reward.device)
    return out.index_add_(0, inp.step_episode, inp.step_reward)  # (E,)


def discounted_returns(inp: AdvantageInput, gamma: float) -> Tensor:
    """(S,) G_t = r_t + gamma * G_{t+1} within each episode (G after the last step is 0).

    Loops over time positions (the longest episode), vectorised over episodes; no gamma**-t
    trick, so long episodes stay numerically exact.
    """
    r = inp.step_reward
    e = inp.episode_group.numel()
    if r.numel() == 0:
        return r.clone()
    counts = torch.bincount(inp.step_episode, minlength=e)  # (E,)
    starts = torch.cumsum(counts, 0) - counts  # (E,) first flat index of each episode
    pos = torch.arange(r.numel(), device=r.device) - starts[inp.step_episode]  # (S,) time index
    length = int(counts.max())
    padded = torch.zeros(e, length + 1, dtype=r.dtype, device=r.device)  # (E, L+1), last col = 0
    padded[inp.step_episode, pos] = r
    for t in range(length - 1, -1, -1):
        padded[:, t] = padded[:, t] + gamma * padded[:, t + 1]
    return padded[inp.step_episode, pos]  # (S,)


def zero_variance_groups(inp: AdvantageInput) -> Tensor:
    """(E,) bool: the episode's group has all-equal returns (DAPO dynamic sampling drops these).

    Yu et al. 2025 (DAPO) filter groups whose accuracy is 0 or 1; here any group of equal returns
    (singletons included) is flagged, because every estimator gives it a zero advantage.
    """
    inv, n = _dense(inp.episode_group)
    return _constant_groups(episode_returns(inp), inv, n)[inv]


# ------------------------------------------------------------------ group statistics


def _dense(ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary ids (N,) or keys (N, k) to dense 0..n-1 group indices (N,) and n."""
    uniq, inv = torch.unique(ids, dim=0 if ids.dim() > 1 else None, return_inverse=True)
    return inv, uniq.shape[0]


def _constant_groups(values: Tensor, inv: Tensor, n: int) -> Tensor:
    """(n,) bool: min == max over each group's values (exact, unlike std == 0 after a mean)."""
    lo = torch.full((n,), float("inf"), dtype=values.dtype, device=values.device)
    hi = torch.full((n,), float("-inf"), dtype=values.dtype, device=values.device)
    lo = lo.scatter_reduce(0, inv, values, reduce="amin")
    hi = hi.scatter_reduce(0, inv, values, reduce="amax")
    return lo == hi


def _normalise(values: Tensor, groups: Tensor, *, by_std: bool, eps: float) -> Tensor:
    """(N,) values minus their group mean, divided by (population std + eps) if ``by_std``.

    Constant groups (singletons included) get exactly 0; the std is the population std
    (``unbiased=False``) so a two-member group is well defined and the std of n=1 never NaNs.
    """
    inv, n = _dense(groups)
    count = torch.bincount(inv, minlength=n).to(values.dtype)  # (n,)
    mean = (
        torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, inv, values) / count
    )
    out = values - mean[inv]  # (N,)
    if by_std:
        var = torch.zeros_like(mean).index_add_(0, inv, out * out) / count  # (n,)
        out = out / (var.sqrt()[inv] + eps)
    return torch.where(_constant_groups(values, inv, n)[inv], torch.zeros_like(out), out)


# ------------------------------------------------------------------ estimators


@advantage("grpo")
def grpo(inp: AdvantageInput, cfg: AdvantageConfig) -> Tensor:
    """(R - mean_g) / (std_g + eps) per episode, broadcast to its steps (DeepSeekMath, Shao 2024).

    Departure: std is the population std (``unbiased=False``); TRL uses the sample std, which is
    undefined for a group of one and inflates advantages by sqrt(G/(G-1)) for small G.
    """
    adv = _normalise(episode_returns(inp), inp.episode_group, by_std=True, eps=cfg.eps)  # (E,)
    return adv[inp.step_episode]  # (S,)


@advantage("dr_grpo")
def dr_grpo(inp: AdvantageInput, cfg: AdvantageConfig) -> Tensor:
    """R - mean_g without the std division (Liu et al. 2025, "Understanding R1-Zero-Like Training").

    Dividing by the std up-weights near-uniform groups (too easy or too hard questions); Dr. GRPO
    drops it. Pair with the ``seq_sum_norm`` aggregation to also remove the length bias.
    """
    adv = _normalise(episode_returns(inp), inp.episode_group, by_std=False, eps=cfg.eps)  # (E,)
    return adv[inp.step_episode]  # (S,)


@advantage("rloo")
def rloo(inp: AdvantageInput, cfg: AdvantageConfig) -> Tensor:
    """R_i - mean of the other episodes of the group (Ahmadian et al. 2024, "Back to Basics").

    The leave-one-out baseline is independent of R_i, so the estimate is unbiased. A singleton
    group has no "others" and gets 0.
    """
    ret = episode_returns(inp)  # (E,)
    inv, n = _dense(inp.episode_group)
    count = torch.bincount(inv, minlength=n).to(ret.dtype)[inv]  # (E,) group size per episode
    total = torch.zeros(n, dtype=ret.dtype, device=ret.device).index_add_(0, inv, ret)[inv]  # (E,)
    others = (total - ret) / (count - 1).clamp(min=1)  # (E,) mean of the other episodes
    zero = (count < 2) | _constant_groups(ret, inv, n)[inv]
    adv = torch.where(zero, torch.zeros_like(ret), ret - others)  # (E,)
    return adv[inp.step_episode]  # (S,)


@advantage("gigpo")
def gigpo(inp: AdvantageInput, cfg: AdvantageConfig) -> Tensor:
    """A = A_episode + omega * A_step (Feng et al. 2025, "Group-in-Group Policy Optimization").

    A_episode normalises the episode return within its episode group. A_step normalises the
    discounted step return G_t within the anchor group: the steps of one episode group that share
    a ``step_anchor`` (here: the same graph node seeing the same observation). Both levels use
    ``cfg.gigpo_norm`` (paper default "mean", F_norm = 1).

    Departures: the paper (and verl-agent) discount with ``gamma`` on env rewards per env step;
    here a step is an LLM call. A singleton anchor group gets A_step = 0 (verl-agent instead keeps
    the raw return by using mean 0 and std 1 for singletons).
    """
    by_std = cfg.gigpo_norm == "std"
    a_ep = _normalise(episode_returns(inp), inp.episode_group, by_std=by_std, eps=cfg.eps)  # (E,)
    key = torch.stack([inp.episode_group[inp.step_episode], inp.step_anchor], dim=1)  # (S, 2)
    g = discounted_returns(inp, cfg.gamma)  # (S,)
    a_step = _normalise(g, key, by_std=by_std, eps=cfg.eps)  # (S,)
    return a_ep[inp.step_episode] + cfg.omega * a_step  # (S,)
