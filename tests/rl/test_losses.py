"""Policy losses and aggregations against hand-computed numbers (arithmetic in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from evoagent.errors import RLError, SpecError
from evoagent.rl.losses import (
    LossConfig,
    LossInputs,
    dpo,
    get_aggregation,
    get_policy_loss,
    known_aggregations,
    known_policy_losses,
)

f64 = torch.float64
LN2 = math.log(2.0)


def _leaf(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=f64, requires_grad=True)


def _ratios_input(ratios: list[list[float]], adv: list[float]) -> LossInputs:
    """old_logp = 0 and logp = log(r), so the ratio of each token is r."""
    logp = _leaf([[math.log(r) for r in row] for row in ratios])
    zeros = torch.zeros_like(logp).detach()
    return LossInputs(logp, zeros, torch.tensor(adv, dtype=f64), torch.ones_like(zeros))


def test_clip_hand_computed() -> None:
    # row 0 has A = +1, row 1 has A = -1; ratios 1.0 (inside), 1.5 (> 1.28), 0.5 (< 0.8)
    inp = _ratios_input([[1.0, 1.5, 0.5], [1.0, 1.5, 0.5]], [1.0, -1.0])
    out = get_policy_loss("clip")(inp, LossConfig())
    # per token -min(r A, clip(r, 0.8, 1.28) A):
    #   A=+1: -min(1, 1) = -1;  -min(1.5, 1.28) = -1.28 (clipped);  -min(0.5, 0.8) = -0.5
    #   A=-1: -min(-1, -1) = 1; -min(-1.5, -1.28) = 1.5;            -min(-0.5, -0.8) = 0.8 (clipped)
    # token_mean: (-1 - 1.28 - 0.5 + 1 + 1.5 + 0.8) / 6 = 0.52 / 6 = 0.0866667
    assert out.loss.item() == pytest.approx(0.52 / 6)
    assert out.metrics["clip_fraction"] == pytest.approx(2 / 6)
    assert out.metrics["ratio_mean"] == pytest.approx((1.0 + 1.5 + 0.5) * 2 / 6)  # = 1.0
    assert out.metrics["kl"] == 0.0
    out.loss.backward()
    # d(-r A)/dlogp = -A r where unclipped, 0 where the clipped branch is active; then / 6
    expected = [[-1.0 / 6, 0.0, -0.5 / 6], [1.0 / 6, 1.5 / 6, 0.0]]
    torch.testing.assert_close(inp.logp.grad, torch.tensor(expected, dtype=f64))


def test_clip_symmetric_bounds_change_clipping() -> None:
    # with clip_high = 0.2 too, r = 1.25 (A=+1) is now clipped at 1.2: loss -1.2, clip_fraction 1
    inp = _ratios_input([[1.25]], [1.0])
    out = get_policy_loss("clip")(inp, LossConfig(clip_high=0.2))
    assert out.loss.item() == pytest.approx(-1.2)
    assert out.metrics["clip_fraction"] == 1.0
    # with the default clip_high = 0.28 it is inside: loss -1.25, nothing clipped
    out = get_policy_loss("clip")(inp, LossConfig())
    assert out.loss.item() == pytest.approx(-1.25)
    assert out.metrics["clip_fraction"] == 0.0


def test_k3_kl() -> None:
    # ratio 1 and A = 0, so the surrogate is 0 and only beta * k3 remains.
    # ref - logp = d in [0, ln 2, -ln 2]; k3 = e^d - d - 1:
    #   d=0: 0;  d=ln2: 2 - ln2 - 1 = 0.3068528;  d=-ln2: 0.5 + ln2 - 1 = 0.1931472; sum = 0.5
    logp = _leaf([[-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.0, -1.0 + LN2, -1.0 - LN2]], dtype=f64)
    inp = LossInputs(
        logp, logp.detach().clone(), torch.zeros(1, dtype=f64), torch.ones(1, 3), ref_logp=ref
    )
    out = get_policy_loss("clip")(inp, LossConfig(kl_beta=0.1))
    assert out.metrics["kl"] == pytest.approx(0.5 / 3)  # 0.1666667
    assert out.loss.item() == pytest.approx(0.1 * 0.5 / 3)  # 0.0166667


def test_kl_needs_ref() -> None:
    inp = _ratios_input([[1.0]], [1.0])
    with pytest.raises(RLError, match="ref_logp"):
        get_policy_loss("clip")(inp, LossConfig(kl_beta=0.1))


# Ragged mask: row 0 has 3 tokens, row 1 has 2, row 2 none; masked slots hold garbage.
PER_TOKEN = torch.tensor(
    [[1.0, 2.0, 3.0, 1e4], [10.0, 20.0, -1e4, float("inf")], [5.0, 5.0, 5.0, 5.0]]
)
RAGGED = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_aggregations_on_ragged_mask() -> None:
    cfg = LossConfig(max_completion_tokens=4)
    # token_mean: (1 + 2 + 3 + 10 + 20) / 5 = 36 / 5 = 7.2
    assert get_aggregation("token_mean")(PER_TOKEN, RAGGED, cfg).item() == pytest.approx(7.2)
    # seq_mean_token_mean: row means 6/3 = 2, 30/2 = 15; the empty row is left out -> 17/2 = 8.5
    assert get_aggregation("seq_mean_token_mean")(PER_TOKEN, RAGGED, cfg).item() == pytest.approx(
        8.5
    )
    # seq_sum_norm: 36 / (B * max_completion_tokens) = 36 / (3 * 4) = 3
    assert get_aggregation("seq_sum_norm")(PER_TOKEN, RAGGED, cfg).item() == pytest.approx(3.0)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_sum_norm"])
def test_all_masked_batch_is_zero_not_nan(agg: str) -> None:
    assert get_aggregation(agg)(PER_TOKEN, torch.zeros_like(RAGGED), LossConfig()).item() == 0.0


def test_sft_ignores_advantages() -> None:
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    for adv in ([1.0, 1.0], [-3.0, 7.0]):
        logp = _leaf([[-1.0, -2.0], [-3.0, -4.0]])
        inp = LossInputs(logp, logp.detach().clone(), torch.tensor(adv, dtype=f64), mask)
        out = get_policy_loss("sft")(inp, LossConfig())
        # -(-1 - 2 - 3) / 3 tokens = 2 (the -4 is masked)
        assert out.loss.item() == pytest.approx(2.0)
        out.loss.backward()
        torch.testing.assert_close(
            logp.grad, torch.tensor([[-1 / 3, -1 / 3], [-1 / 3, 0.0]], dtype=f64)
        )


def test_reinforce() -> None:
    logp = _leaf([[-1.0, -2.0], [-3.0, -4.0]])
    inp = LossInputs(
        logp, logp.detach().clone(), torch.tensor([2.0, -1.0], dtype=f64), torch.ones(2, 2)
    )
    out = get_policy_loss("reinforce")(inp, LossConfig())
    # -A logp: [[2*1, 2*2], [-1*3, -1*4]] = [[2, 4], [-3, -4]] -> mean (2 + 4 - 3 - 4) / 4 = -0.25
    assert out.loss.item() == pytest.approx(-0.25)


def test_tis_weight_cap() -> None:
    # old - rollout = [ln 3, ln 0.5] -> weights [3, 0.5]; cap 2 -> [2, 0.5]
    logp = _leaf([[-1.0, -1.0]])
    rollout = torch.tensor([[-1.0 - math.log(3.0), -1.0 - math.log(0.5)]], dtype=f64)
    inp = LossInputs(
        logp,
        logp.detach().clone(),
        torch.ones(1, dtype=f64),
        torch.ones(1, 2),
        rollout_logp=rollout,
    )
    out = get_policy_loss("clip")(inp, LossConfig(tis_cap=2.0))
    # ratio 1, A = 1: per token -1 * w = [-2, -0.5] -> mean -1.25
    assert out.loss.item() == pytest.approx(-1.25)
    assert out.metrics["tis_weight_mean"] == pytest.approx(1.25)
    # without the cap set, rollout_logp is ignored: mean of [-1, -1] = -1
    assert get_policy_loss("clip")(inp, LossConfig()).loss.item() == pytest.approx(-1.0)
    with pytest.raises(RLError, match="rollout_logp"):
        get_policy_loss("clip")(_ratios_input([[1.0]], [1.0]), LossConfig(tis_cap=2.0))


@pytest.mark.parametrize("name", ["clip", "reinforce", "sft"])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_sum_norm"])
def test_masked_tokens_get_exactly_zero_gradient(name: str, agg: str) -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    keep = mask > 0
    real = torch.full((3, 4), -0.5)
    # garbage in every masked slot: exp(1e4 - -1e4) overflows if it ever reaches an exp
    logp = torch.where(keep, real, torch.tensor(1e4)).requires_grad_(True)
    old = torch.where(keep, real - 0.1, torch.tensor(-1e4))
    ref = torch.where(keep, real + 0.2, torch.tensor(3e4))
    rollout = torch.where(keep, real - 0.3, torch.tensor(-5e4))
    adv = torch.tensor([1.5, -2.0, float("nan")])  # the NaN sits in an all-masked row
    inp = LossInputs(logp, old, adv, mask, ref_logp=ref, rollout_logp=rollout)
    out = get_policy_loss(name)(inp, LossConfig(agg=agg, kl_beta=0.05, tis_cap=2.0))
    assert torch.isfinite(out.loss)
    assert all(math.isfinite(v) for v in out.metrics.values())
    out.loss.backward()
    assert logp.grad is not None
    assert (logp.grad[~keep] == 0).all()
    assert (logp.grad[keep] != 0).all()


def test_unknown_names_list_known() -> None:
    with pytest.raises(RLError) as err:
        get_policy_loss("dpo")
    assert "['clip', 'reinforce', 'sft']" in str(err.value)
    with pytest.raises(RLError) as err:
        get_aggregation("sum")
    assert "['seq_mean_token_mean', 'seq_sum_norm', 'token_mean']" in str(err.value)
    assert known_policy_losses() == ["clip", "reinforce", "sft"]
    assert known_aggregations() == ["seq_mean_token_mean", "seq_sum_norm", "token_mean"]


def test_bad_config_and_shapes_raise() -> None:
    with pytest.raises(SpecError, match="clip_low"):
        LossConfig(clip_low=1.0)
    with pytest.raises(RLError, match="advantages"):
        LossInputs(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))


def test_dpo_hand_computed() -> None:
    # pair 0: margin = (-1 - -2) - (-3 - -3) = 1;  pair 1: margin = (-2 - -1) - (-1 - -1) = -1
    pc = torch.tensor([-1.0, -2.0], dtype=f64, requires_grad=True)
    pr = torch.tensor([-3.0, -1.0], dtype=f64, requires_grad=True)
    rc, rr = torch.tensor([-2.0, -1.0], dtype=f64), torch.tensor([-3.0, -1.0], dtype=f64)
    out = dpo(pc, pr, rc, rr, beta=0.5)
    # -mean(log sigmoid(0.5), log sigmoid(-0.5)) = mean(log(1+e^-0.5), log(1+e^0.5))
    want = (math.log1p(math.exp(-0.5)) + math.log1p(math.exp(0.5))) / 2
    assert float(out.loss.detach()) == pytest.approx(want)
    assert out.metrics["reward_margin"] == pytest.approx(0.0)
    assert out.metrics["pair_accuracy"] == pytest.approx(0.5)
    out.loss.backward()
    # d/d pc_i = -beta * sigmoid(-beta m_i) / P: pair 0 sigmoid(-0.5), pair 1 sigmoid(0.5)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert pc.grad is not None and pr.grad is not None
    torch.testing.assert_close(pc.grad, torch.tensor([-0.25 * sig(-0.5), -0.25 * sig(0.5)], dtype=f64))
    torch.testing.assert_close(pr.grad, -pc.grad)
    with pytest.raises(RLError, match="four"):
        dpo(pc[:1], pr, rc, rr, beta=0.5)
