"""Advantage estimators against hand-computed numbers (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from evoagent.errors import RLError, SpecError
from evoagent.rl.advantages import (
    AdvantageConfig,
    AdvantageInput,
    discounted_returns,
    episode_returns,
    get_advantage,
    known_advantages,
    zero_variance_groups,
)

f64 = torch.float64


def _inp(
    groups: list[int], steps: list[list[float]], anchors: list[list[int]] | None = None
) -> AdvantageInput:
    """Build an input from per-episode step reward lists (anchors default to the time index)."""
    anchors = anchors or [list(range(len(s))) for s in steps]
    return AdvantageInput(
        episode_group=torch.tensor(groups),
        step_episode=torch.tensor([e for e, s in enumerate(steps) for _ in s]),
        step_reward=torch.tensor([r for s in steps for r in s], dtype=f64),
        step_anchor=torch.tensor([a for row in anchors for a in row]),
    )


# Two interleaved groups with non-contiguous ids 7 and 3; episode 0 spreads its reward over 2 steps.
#   group 7: episodes 0, 2, 3 with returns 1+2=3, 1, 2
#   group 3: episodes 1, 4    with returns 0, 4
TWO_GROUPS = _inp([7, 3, 7, 7, 3], [[1.0, 2.0], [0.0], [1.0], [0.0, 2.0], [4.0]])
# step -> episode: [0, 0, 1, 2, 3, 3, 4]


def test_returns() -> None:
    assert episode_returns(TWO_GROUPS).tolist() == [3.0, 0.0, 1.0, 2.0, 4.0]
    inp = _inp([0, 0], [[1.0, 0.0, 2.0], [4.0]])
    # episode 0, gamma 0.5: G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5*1 = 1.5; episode 1: G0 = 4
    assert discounted_returns(inp, 0.5).tolist() == [1.5, 1.0, 2.0, 4.0]


def test_grpo_two_groups() -> None:
    adv = get_advantage("grpo")(TWO_GROUPS, AdvantageConfig(eps=0.0))
    # group 7: returns 3, 1, 2: mean 2, population var (1+1+0)/3 = 2/3, std = sqrt(2/3) = 0.8164966
    #   -> (3-2)/0.8164966 = 1.2247449, (1-2)/0.8164966 = -1.2247449, 0
    # group 3: returns 0, 4: mean 2, std 2 -> -1, 1
    s = 1.0 / math.sqrt(2.0 / 3.0)  # 1.2247449
    expected = [s, s, -1.0, -s, 0.0, 0.0, 1.0]  # per step (episode 0 has two steps, episode 3 too)
    assert adv.dtype == f64
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=f64))


def test_grpo_eps() -> None:
    adv = get_advantage("grpo")(TWO_GROUPS, AdvantageConfig(eps=1.0))
    # group 3: (4-2)/(2+1) = 0.6666667
    assert adv[-1].item() == pytest.approx(2.0 / 3.0)


def test_dr_grpo_two_groups() -> None:
    adv = get_advantage("dr_grpo")(TWO_GROUPS, AdvantageConfig())
    # group 7: 3-2, 1-2, 2-2 = 1, -1, 0; group 3: 0-2, 4-2 = -2, 2
    torch.testing.assert_close(adv, torch.tensor([1.0, 1.0, -2.0, -1.0, 0.0, 0.0, 2.0], dtype=f64))


def test_rloo_two_groups_and_singleton() -> None:
    inp = _inp([7, 3, 7, 7, 3, 9], [[1.0, 2.0], [0.0], [1.0], [0.0, 2.0], [4.0], [5.0]])
    adv = get_advantage("rloo")(inp, AdvantageConfig())
    # group 7: 3 - (1+2)/2 = 1.5, 1 - (3+2)/2 = -1.5, 2 - (3+1)/2 = 0
    # group 3: 0 - 4 = -4, 4 - 0 = 4; group 9 is a singleton -> 0
    expected = [1.5, 1.5, -4.0, -1.5, 0.0, 0.0, 4.0, 0.0]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=f64))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "gigpo"])
def test_equal_rewards_give_zeros_without_nan(name: str) -> None:
    # 0.1 three times: the float64 mean is 0.10000000000000002, so a naive (R-mean)/std with eps=0
    # gives -1.0 for every episode (and ~-1.4e-11 with eps=1e-6); the estimators must give exact 0.
    inp = _inp([0, 0, 0, 1], [[0.1], [0.1], [0.1], [0.3]])
    adv = get_advantage(name)(inp, AdvantageConfig(eps=0.0, gigpo_norm="std"))
    assert not torch.isnan(adv).any()
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_zero_variance_groups() -> None:
    inp = _inp([0, 0, 1, 1, 2], [[1.0], [1.0], [0.0], [1.0], [0.5]])
    # group 0 returns equal, group 1 differs, group 2 is a singleton (trivially equal)
    assert zero_variance_groups(inp).tolist() == [True, True, False, False, True]


# GiGPO fixture, gamma = 0.5, omega = 0.5, mean normalisation.
#   ep0 (group 0): anchors [0, 1],    rewards [0, 1]      R = 1,   G = [0 + 0.5*1, 1] = [0.5, 1]
#   ep1 (group 0): anchors [0, 1, 2], rewards [0, 0, 0.6] R = 0.6, G = [0.15, 0.3, 0.6]
#   ep2 (group 1): anchors [0],       rewards [0.4]       R = 0.4, G = [0.4]
#   ep3 (group 1): anchors [0],       rewards [0.2]       R = 0.2, G = [0.2]
# Anchor 0 of group 1 must not merge with anchor 0 of group 0.
GIGPO = _inp(
    [0, 0, 1, 1], [[0.0, 1.0], [0.0, 0.0, 0.6], [0.4], [0.2]], [[0, 1], [0, 1, 2], [0], [0]]
)


def test_gigpo_hand_computed() -> None:
    adv = get_advantage("gigpo")(GIGPO, AdvantageConfig(gamma=0.5, omega=0.5))
    # A_episode: group 0 mean 0.8 -> +0.2, -0.2; group 1 mean 0.3 -> +0.1, -0.1
    # A_step: group0/anchor0: G 0.5, 0.15 mean 0.325 -> +0.175, -0.175
    #         group0/anchor1: G 1, 0.3 mean 0.65     -> +0.35, -0.35
    #         group0/anchor2: singleton              -> 0
    #         group1/anchor0: G 0.4, 0.2 mean 0.3    -> +0.1, -0.1
    expected = [
        0.2 + 0.5 * 0.175,  # ep0 t0 = 0.2875
        0.2 + 0.5 * 0.35,  # ep0 t1 = 0.375
        -0.2 - 0.5 * 0.175,  # ep1 t0 = -0.2875
        -0.2 - 0.5 * 0.35,  # ep1 t1 = -0.375
        -0.2 + 0.5 * 0.0,  # ep1 t2 = -0.2 (singleton anchor group)
        0.1 + 0.5 * 0.1,  # ep2 t0 = 0.15
        -0.1 - 0.5 * 0.1,  # ep3 t0 = -0.15
    ]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=f64))


def test_gigpo_std_norm() -> None:
    adv = get_advantage("gigpo")(
        GIGPO, AdvantageConfig(eps=0.0, gamma=0.5, omega=0.5, gigpo_norm="std")
    )
    # every non-singleton group here has two members, so (x - mean)/std_pop = +-1:
    # ep0: 1 + 0.5*1 = 1.5 on both steps; ep1: -1.5, -1.5, then -1 + 0 = -1; ep2: 1.5; ep3: -1.5
    torch.testing.assert_close(
        adv, torch.tensor([1.5, 1.5, -1.5, -1.5, -1.0, 1.5, -1.5], dtype=f64)
    )


def test_unknown_name_lists_known() -> None:
    with pytest.raises(RLError) as err:
        get_advantage("ppo")
    assert "['dr_grpo', 'gigpo', 'grpo', 'rloo']" in str(err.value)
    assert known_advantages() == ["dr_grpo", "gigpo", "grpo", "rloo"]


def test_bad_inputs_raise() -> None:
    with pytest.raises(RLError, match="ordered"):
        AdvantageInput(
            torch.tensor([0, 0]),
            torch.tensor([1, 0]),
            torch.zeros(2),
            torch.zeros(2, dtype=torch.long),
        )
    with pytest.raises(SpecError, match="gamma"):
        AdvantageConfig(gamma=1.5)
