"""Policy-gradient losses over token logprobs, and the aggregations that make them one scalar.

Both are registries (``@policy_loss``, ``@aggregation``), so a new loss or normaliser is one
decorated function, never an ``elif`` (the fix for TRL's ``loss_type``). One row is one LLM step's
completion. A masked token (prompt, tool output, env text, padding) contributes nothing and gets
exactly zero gradient whatever garbage it holds: inputs are zeroed at masked positions before any
``exp``, so no ``0 * inf`` reaches the backward pass. An all-masked row contributes nothing. Every
loss adds ``kl_beta * k3``; TIS weights apply to ``clip`` and ``reinforce``, not to ``sft``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from evoagent.errors import RLError, SpecError
from evoagent.registry import Registry


@dataclass(frozen=True)
class LossConfig:
    """Knobs of the policy losses.

    Attributes:
        clip_low: PPO epsilon below 1: the ratio is clipped at 1 - clip_low (Schulman et al. 2017).
        clip_high: epsilon above 1; larger than clip_low is DAPO's clip-higher (Yu et al. 2025).
        kl_beta: weight of the k3 KL estimator to the reference policy (Schulman 2020); 0 = off.
        agg: key in the aggregation registry (token_mean | seq_mean_token_mean | seq_sum_norm).
        max_completion_tokens: constant normaliser of Dr. GRPO's ``seq_sum_norm`` (Liu et al. 2025).
        tis_cap: cap C of the truncated importance weight min(pi_old / pi_rollout, C) (Yao et al.
            2025); None = no correction.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_beta: float = 0.0
    agg: str = "token_mean"
    max_completion_tokens: int = 256
    tis_cap: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_low < 1.0:
            raise SpecError(f"LossConfig.clip_low: must lie in [0, 1), got {self.clip_low}")
        if self.clip_high < 0.0:
            raise SpecError(f"LossConfig.clip_high: must be >= 0, got {self.clip_high}")
        if self.kl_beta < 0.0:
            raise SpecError(f"LossConfig.kl_beta: must be >= 0, got {self.kl_beta}")
        if self.max_completion_tokens < 1:
            raise SpecError(
                f"LossConfig.max_completion_tokens: must be >= 1, got {self.max_completion_tokens}"
            )
        if self.tis_cap is not None and self.tis_cap <= 0.0:
            raise SpecError(f"LossConfig.tis_cap: must be > 0 or None, got {self.tis_cap}")


@dataclass(frozen=True)
class LossInputs:
    """One batch of completions (one row = one LLM step) and what the losses need about it.

    Attributes:
        logp: (B, T) token logprobs under the current policy (requires grad).
        old_logp: (B, T) logprobs of the policy that sampled the tokens (detached).
        advantages: (B,) one advantage per row, or (B, T) one per token (a multi-turn row
            whose turns have different advantages).
        mask: (B, T) 1.0 for policy tokens that are trained, 0.0 for prompt/tool/env/padding.
        ref_logp: (B, T) reference-policy logprobs; needed when kl_beta > 0.
        rollout_logp: (B, T) logprobs the inference backend reported; needed when tis_cap is set.
    """

    logp: Tensor  # (B, T)
    old_logp: Tensor  # (B, T)
    advantages: Tensor  # (B,) or (B, T)
    mask: Tensor  # (B, T)
    ref_logp: Tensor | None = None  # (B, T)
    rollout_logp: Tensor | None = None  # (B, T)

    def __post_init__(self) -> None:
        if self.logp.dim() != 2:
            raise RLError(f"logp must be (B, T), got {tuple(self.logp.shape)}")
        shape = self.logp.shape
        for name in ("old_logp", "mask", "ref_logp", "rollout_logp"):
            t = getattr(self, name)
            if t is not None and t.shape != shape:
                raise RLError(
                    f"{name} must have the shape of logp {tuple(shape)}, got {tuple(t.shape)}"
                )
        if self.advantages.shape not in (shape[:1], shape):
            raise RLError(
                f"advantages must be ({shape[0]},) or {tuple(shape)}, "
                f"got {tuple(self.advantages.shape)}"
            )


@dataclass(frozen=True)
class LossOutput:
    """The scalar to backpropagate and detached diagnostics.

    Attributes:
        loss: scalar tensor.
        metrics: clip_fraction, kl (0.0 without ref_logp), ratio_mean, tis_weight_mean (1.0 when
            off), each a mean over the trained tokens of the batch.
    """

    loss: Tensor
    metrics: dict[str, float]


PolicyLossFn = Callable[[LossInputs, LossConfig], LossOutput]
AggregationFn = Callable[[Tensor, Tensor, LossConfig], Tensor]  # ((B, T), (B, T), cfg) -> ()

_LOSSES: Registry[PolicyLossFn] = Registry("policy loss", RLError)
_AGGS: Registry[AggregationFn] = Registry("aggregation", RLError)


policy_loss = _LOSSES.register  # ``@policy_loss("name")``: register a loss (a name once)
get_policy_loss = _LOSSES.get  # an unknown name raises RLError listing the known ones
known_policy_losses = _LOSSES.names
aggregation = _AGGS.register  # ``@aggregation("name")``: how token losses become one number
get_aggregation = _AGGS.get
known_aggregations = _AGGS.names


# ------------------------------------------------------------------ aggregations
# Each normalises by counts of this call's batch; a trainer that accumulates gradients over
# micro-batches must scale by its own global count to get the same objective.


@aggregation("token_mean")
def token_mean(per_token: Tensor, mask: Tensor, cfg: LossConfig) -> Tensor:
    """Sum over all trained tokens / their number in the batch (DAPO, Yu et al. 2025)."""
    keep = mask > 0  # (B, T)
    return torch.where(keep, per_token, 0.0).sum() / keep.sum().clamp(min=1)


@aggregation("seq_mean_token_mean")
def seq_mean_token_mean(per_token: Tensor, mask: Tensor, cfg: LossConfig) -> Tensor:
    """Mean over each row's tokens, then over rows (original GRPO, Shao et al. 2024).

    Departure: all-masked rows are left out of the mean over rows instead of counting as 0.
    """
    keep = mask > 0  # (B, T)
    n = keep.sum(dim=1)  # (B,)
    row = torch.where(keep, per_token, 0.0).sum(dim=1) / n.clamp(min=1)  # (B,)
    return row.sum() / (n > 0).sum().clamp(min=1)


@aggregation("seq_sum_norm")
def seq_sum_norm(per_token: Tensor, mask: Tensor, cfg: LossConfig) -> Tensor:
    """Sum of trained-token losses / (B * max_completion_tokens) (Dr. GRPO, Liu et al. 2025).

    The constant normaliser removes GRPO's length bias; B counts every row, empty ones included.
    """
    keep = mask > 0  # (B, T)
    return torch.where(keep, per_token, 0.0).sum() / (
        max(per_token.shape[0], 1) * cfg.max_completion_tokens
    )


# ------------------------------------------------------------------ shared pieces


def _masked(x: Tensor, keep: Tensor) -> Tensor:
    """(B, T) x at trained tokens, 0 elsewhere; masked positions get exactly zero gradient."""
    return torch.where(keep, x, torch.zeros_like(x))


def _tokens(inp: LossInputs) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """keep (B, T) bool, and logp, old_logp, advantage per token (B, T), each 0 where masked."""
    keep = inp.mask > 0
    logp = _masked(inp.logp, keep)
    old = _masked(inp.old_logp.detach(), keep)
    a = inp.advantages.detach()
    adv = _masked(a[:, None].expand_as(logp) if a.dim() == 1 else a, keep)
    return keep, logp, old, adv


def _tis_weight(inp: LossInputs, keep: Tensor, cfg: LossConfig) -> Tensor:
    """(B, T) detached min(exp(old_logp - rollout_logp), tis_cap); 1 where masked or off."""
    if cfg.tis_cap is None:
        return torch.ones_like(inp.logp).detach()
    if inp.rollout_logp is None:
        raise RLError("LossConfig.tis_cap is set but LossInputs.rollout_logp is None")
    log_w = _masked(inp.old_logp.detach() - inp.rollout_logp.detach(), keep)
    return torch.exp(log_w).clamp(max=cfg.tis_cap)


def _finish(
    per_token: Tensor, inp: LossInputs, cfg: LossConfig, clipped: Tensor, w: Tensor
) -> LossOutput:
    """Add the KL term, aggregate, and gather metrics over the trained tokens."""
    keep, logp, old, _ = _tokens(inp)  # (B, T) each
    if cfg.kl_beta > 0 and inp.ref_logp is None:
        raise RLError("LossConfig.kl_beta > 0 needs LossInputs.ref_logp")
    k3 = torch.zeros_like(logp)  # (B, T)
    if inp.ref_logp is not None:
        d = _masked(inp.ref_logp.detach(), keep) - logp  # log(pi_ref / pi)
        k3 = torch.exp(d) - d - 1.0  # unbiased, always >= 0 (Schulman 2020, "Approximating KL")
    if cfg.kl_beta > 0:
        per_token = per_token + cfg.kl_beta * k3
    loss = get_aggregation(cfg.agg)(_masked(per_token, keep), inp.mask, cfg)
    ratio = torch.exp(logp.detach() - old)  # (B, T); 1 where masked
    sums = [_masked(x.detach().to(logp.dtype), keep).sum() for x in (keep, clipped, k3, ratio, w)]
    n, clipped_n, kl_sum, ratio_sum, w_sum = torch.stack(sums).tolist()  # one device sync
    metrics = {
        "clip_fraction": clipped_n / n if n else 0.0,
        "kl": kl_sum / n if n else 0.0,
        "ratio_mean": ratio_sum / n if n else 1.0,
        "tis_weight_mean": w_sum / n if n else 1.0,
    }
    return LossOutput(loss=loss, metrics=metrics)


# ------------------------------------------------------------------ losses


@policy_loss("clip")
def clip(inp: LossInputs, cfg: LossConfig) -> LossOutput:
    """-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) per token, r = pi / pi_old (PPO/GRPO).

    Asymmetric clip is DAPO's clip-higher. ``clip_fraction`` counts tokens where the clipped branch
    is active (r > 1 + clip_high with A > 0, or r < 1 - clip_low with A < 0), i.e. the tokens whose
    gradient clipping zeroed. With ``tis_cap`` the surrogate is multiplied by the TIS weight.
    """
    keep, logp, old, a = _tokens(inp)  # (B, T) each
    ratio = torch.exp(logp - old)  # (B, T); 1 where masked
    hi, lo = 1.0 + cfg.clip_high, 1.0 - cfg.clip_low
    surrogate = torch.minimum(ratio * a, ratio.clamp(lo, hi) * a)  # (B, T)
    clipped = ((ratio > hi) & (a > 0)) | ((ratio < lo) & (a < 0))  # (B, T) bool
    w = _tis_weight(inp, keep, cfg)  # (B, T)
    return _finish(-surrogate * w, inp, cfg, clipped, w)


@policy_loss("reinforce")
def reinforce(inp: LossInputs, cfg: LossConfig) -> LossOutput:
    """-A * logp per token: vanilla REINFORCE (Williams 1992), no ratio and no clipping.

    Assumes on-policy samples (old_logp only feeds the ratio metric); ``tis_cap`` still corrects
    a trainer/sampler mismatch.
    """
    keep, logp, _, a = _tokens(inp)  # (B, T) each
    w = _tis_weight(inp, keep, cfg)  # (B, T)
    return _finish(-a * logp * w, inp, cfg, torch.zeros_like(keep), w)


@policy_loss("sft")
def sft(inp: LossInputs, cfg: LossConfig) -> LossOutput:
    """-logp of the trained tokens, advantages ignored (rejection-sampling fine-tuning, RFT).

    Trains on the best agents' trajectories (Yuan et al. 2023). No TIS: imitation has no sampler
    to correct for.
    """
    keep, logp, _, _ = _tokens(inp)  # (B, T) each
    return _finish(-logp, inp, cfg, torch.zeros_like(keep), torch.ones_like(logp).detach())


# ------------------------------------------------------------------ preference pairs


def dpo(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    beta: float,
) -> LossOutput:
    """-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), the mean over pairs (DPO,
    Rafailov et al. 2023); each input is (P,): a trajectory's summed logprob of its policy tokens.

    Metrics: ``reward_margin`` (mean beta * margin, the implicit reward gap) and
    ``pair_accuracy`` (share of pairs whose chosen side already has the larger implicit reward).
    """
    shapes = {tuple(t.shape) for t in (policy_chosen, policy_rejected, ref_chosen, ref_rejected)}
    if len(shapes) != 1 or policy_chosen.dim() != 1 or policy_chosen.numel() == 0:
        raise RLError(f"dpo needs four (P,) tensors with P > 0, got shapes {sorted(shapes)}")
    if beta <= 0:
        raise SpecError(f"dpo beta: must be > 0, got {beta}")
    margin = (policy_chosen - ref_chosen.detach()) - (policy_rejected - ref_rejected.detach())
    loss = -torch.nn.functional.logsigmoid(beta * margin).mean()
    m = margin.detach()
    return LossOutput(
        loss=loss,
        metrics={
            "reward_margin": float(beta * m.mean()),
            "pair_accuracy": float((m > 0).float().mean()),
        },
    )
