"""DAPO's overlong shaping: the penalty's three regimes, and what it does to a group's
advantages (two right answers of different length are no longer a flat group)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from evoagent.rl.batch import episode_advantages
from evoagent.rl.config import OverlongConfig, RLConfig
from evoagent.rl.shaping import overlong_penalty


@pytest.mark.parametrize(
    ("tokens", "penalty"),
    [(0, 0.0), (60, 0.0), (61, -0.05), (70, -0.5), (80, -1.0), (81, -1.0), (500, -1.0)],
)
def test_the_penalty_is_zero_then_linear_inside_the_buffer_then_one(tokens, penalty):
    assert overlong_penalty(tokens, OverlongConfig(max_tokens=80, buffer=20)) == pytest.approx(penalty)


def test_a_buffer_as_long_as_max_tokens_penalises_from_the_first_token():
    cfg = OverlongConfig(max_tokens=10, buffer=10)
    assert overlong_penalty(0, cfg) == 0.0
    assert overlong_penalty(5, cfg) == pytest.approx(-0.5)


def test_a_buffer_longer_than_max_tokens_is_refused_by_name():
    with pytest.raises(ValidationError, match="buffer: 30 is larger than max_tokens 20"):
        RLConfig(overlong={"max_tokens": 20, "buffer": 30})


def test_overlong_with_rft_is_refused():
    with pytest.raises(ValidationError, match="overlong shapes the reward"):
        RLConfig(algorithm="rft", overlong={"max_tokens": 20, "buffer": 5})


def test_the_longer_of_two_right_answers_gets_the_lower_advantage(step, traj):
    short = step([1], [2] * 4)  # 4 tokens: inside max_tokens - buffer
    long = step([1], [3] * 9)  # 9 tokens: 4 into a buffer of 5 -> penalty 0.8
    trajs = [traj("a", "x", 1.0, [short]), traj("a", "x", 1.0, [long])]
    plain = RLConfig(dynamic_sampling=True)
    assert episode_advantages(trajs, lambda t: t.input_id, plain)[0] == []  # flat: dropped

    shaped = plain.model_copy(update={"overlong": OverlongConfig(max_tokens=10, buffer=5)})
    steps, adv, _ = episode_advantages(trajs, lambda t: t.input_id, shaped)
    assert steps == [short, long]
    assert adv[0] > 0 > adv[1]


def test_the_penalty_counts_every_llm_step_of_an_episode(step, traj):
    turns = [step([1], [2] * 3), step([1, 2, 2, 2], [4] * 3)]  # 6 tokens in all
    one = step([1], [5] * 3)  # 3 tokens
    trajs = [traj("a", "x", 1.0, turns), traj("a", "x", 1.0, [one])]
    cfg = RLConfig(overlong=OverlongConfig(max_tokens=6, buffer=2))
    steps, adv, _ = episode_advantages(trajs, lambda t: t.input_id, cfg)
    assert steps == [*turns, one]
    assert adv[1] < 0 < adv[2]  # the two-turn episode reached max_tokens: penalty 1
