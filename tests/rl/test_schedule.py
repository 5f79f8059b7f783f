"""``rl.schedule`` on scripted gains, and the paired bootstrap that decides a rollback."""

from __future__ import annotations

import pytest

from evoagent.errors import SpecError
from evoagent.rl.config import RLConfig
from evoagent.rl.rollback import judge
from evoagent.rl.schedule import RL, SEARCH, Adaptive, Step, make_schedule


def steps(*spec: tuple[str, int, float]) -> list[Step]:
    """(kind, completions, gain) per step, one generation each."""
    return [Step(i + 1, kind, cost, gain) for i, (kind, cost, gain) in enumerate(spec)]


def test_fixed_trains_every_n_generations_whatever_the_phases_gained():
    fixed = make_schedule("fixed", 2, 0.8, 0.25)
    hurt = steps((SEARCH, 100, 0.0), (RL, 300, -0.5))
    assert [fixed.wants_rl(g, hurt) for g in range(1, 7)] == [False, True, False, True, False, True]


def test_adaptive_warms_up_on_search_then_tries_one_phase():
    adaptive = Adaptive(every=3, discount=0.8, explore=0.25)
    search_only = steps((SEARCH, 100, 0.05), (SEARCH, 100, 0.0))
    assert not adaptive.wants_rl(2, search_only)
    assert adaptive.wants_rl(3, [*search_only, Step(3, SEARCH, 100, 0.0)])


def test_adaptive_keeps_training_while_phases_pay_more_per_completion_than_search():
    adaptive = Adaptive(every=1, discount=0.8, explore=0.25)
    history = steps((SEARCH, 100, 0.02), (RL, 300, 0.12), (SEARCH, 100, 0.0))
    assert adaptive.wants_rl(3, history)  # RL: 0.0004 per completion against search's 0.0001


def test_adaptive_stops_training_after_a_phase_that_hurt_and_retries_only_much_later():
    history = steps((SEARCH, 100, 0.05), (RL, 300, -0.06), (SEARCH, 100, 0.03))
    adaptive = Adaptive(every=1, discount=0.8, explore=0.25)
    assert not adaptive.wants_rl(3, history)
    gens = 3
    while not adaptive.wants_rl(gens, history) and gens < 60:  # a plateaued search
        gens += 1
        history.append(Step(gens, SEARCH, 100, 0.0))
    assert 8 <= gens < 60  # the bonus of the unplayed arm grows until RL is tried again
    never = Adaptive(every=1, discount=0.8, explore=0.0)
    assert not any(never.wants_rl(g, history[: g]) for g in range(3, len(history)))


def test_adaptive_weighs_recent_steps_more():
    """The same two phases in the other order: a phase that paid long ago and hurt just now
    stops training; one that hurt long ago and pays now goes on."""
    adaptive = Adaptive(every=1, discount=0.5, explore=0.0)
    search = [(SEARCH, 100, 0.01)] * 2
    assert not adaptive.wants_rl(6, steps((RL, 300, 0.3), *search, (RL, 300, -0.3), *search))
    assert adaptive.wants_rl(6, steps((RL, 300, -0.3), *search, (RL, 300, 0.3), *search))


def test_a_spec_naming_an_unknown_schedule_or_adaptive_without_rl_is_refused():
    with pytest.raises(ValueError, match="unknown schedule 'bandit'; known: \\['adaptive', 'fixed'\\]"):
        RLConfig(enabled=True, schedule="bandit")
    with pytest.raises(ValueError, match="schedule: 'adaptive' chooses between search generations and RL phases, but rl.enabled is false"):
        RLConfig(schedule="adaptive")
    assert RLConfig().schedule == "fixed"  # RL off with the default schedule is fine
    with pytest.raises(SpecError, match="rl.schedule: unknown schedule 'bandit'"):
        make_schedule("bandit", 1, 0.8, 0.25)


def test_rollback_judges_a_drop_beyond_the_noise_and_not_one_input_flipping():
    before = {f"i{k}": 1.0 if k < 20 else 0.0 for k in range(32)}
    worse = {**before, **{f"i{k}": 0.0 for k in range(8)}}  # 8 of 20 successes lost
    flipped = {**before, "i0": 0.0}  # one input
    mixed = {**before, "i0": 0.0, "i1": 0.0, "i25": 1.0, "i26": 1.0}  # as many won as lost
    assert judge(before, worse, 0.9, seed=0).hurt and judge(before, worse, 0.9, 0).change == -0.25
    assert not judge(before, flipped, 0.9, seed=0).hurt
    assert not judge(before, mixed, 0.9, seed=0).hurt
    assert judge(before, before, 0.9, seed=0).p_drop == 0.0
    assert not judge({}, worse, 0.9, seed=0).hurt  # nothing paired: nothing to judge
