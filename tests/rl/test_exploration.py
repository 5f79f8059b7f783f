"""The count-based exploration bonus: its arithmetic, its state, and what it buys where a sparse
goal is never reached: groups that all score 0 still differ, so a phase has a gradient."""

from __future__ import annotations

import asyncio
import math

import pytest
from pydantic import ValidationError

from evoagent.execute.executor import ExecContext
from evoagent.graph.model import AgentGraph, LoopNode
from evoagent.rl.batch import episode_advantages
from evoagent.rl.config import RLConfig
from evoagent.rl.phase import RLPhase
from evoagent.rl.shaping import CountBonus, known_explorers, make_explorer
from evoagent.spec.config import RewardConfig
from evoagent.tasks.datasets import Example
from evoagent.tasks.envs import environment
from evoagent.tools import ToolContext


def test_the_bonus_is_beta_over_the_root_of_visits_averaged_over_the_episodes_steps(step, traj):
    explorer = make_explorer("count", 0.5)
    common = [step([1], [2], anchor="walk:start"), step([1, 2], [3], anchor="walk:left")]
    rare = [step([1], [2], anchor="walk:start"), step([1, 2], [4], anchor="walk:cliff")]
    episodes = [traj("a", "x", 0.0, common) for _ in range(3)] + [traj("a", "x", 0.0, rare)]
    explorer.observe(episodes)
    assert explorer.state() == {"walk:start": 4, "walk:left": 3, "walk:cliff": 1}
    bonus = explorer.bonus(episodes)
    assert bonus[0] == pytest.approx(0.5 * (1 / 2 + 1 / math.sqrt(3)) / 2)
    assert bonus[3] == pytest.approx(0.5 * (1 / 2 + 1) / 2) and bonus[3] > bonus[0]
    again = CountBonus(0.5)
    again.load(explorer.state())  # what a resumed run reads from the archive
    assert again.bonus(episodes) == bonus
    assert known_explorers() == ["count"]


def test_a_group_that_all_missed_the_goal_learns_towards_the_rarer_state(step, traj):
    common = traj("a", "x", 0.0, [step([1], [2], anchor="walk:left")])
    rare = traj("a", "x", 0.0, [step([1], [3], anchor="walk:cliff")])
    episodes = [common, common, rare]
    cfg = RLConfig(dynamic_sampling=True)
    assert episode_advantages(episodes, lambda t: t.input_id, cfg)[0] == []  # flat: no gradient
    explorer = CountBonus(0.2)
    explorer.observe(episodes)
    steps, adv, _ = episode_advantages(episodes, lambda t: t.input_id, cfg, explorer.bonus(episodes))
    assert len(steps) == 3 and adv[2] > 0 > adv[0]


def test_bad_exploration_settings_name_the_field():
    with pytest.raises(ValidationError, match="unknown exploration kind 'curiosity'; known: \\['count'\\]"):
        RLConfig(exploration={"kind": "curiosity", "beta": 0.1})
    with pytest.raises(ValidationError, match="exploration shapes the reward"):
        RLConfig(algorithm="dpo", exploration={"beta": 0.1})
    with pytest.raises(ValidationError, match="beta"):
        RLConfig(exploration={"beta": 0})


class Corridor:
    """A corridor with no reachable goal: each move goes right or left by the reply's first
    character, and the score is always 0 (the sparse reward of a task not solved yet)."""

    def __init__(self) -> None:
        self.pos = 0

    def observation(self) -> str:
        return f"position {self.pos}"

    def step(self, action: str) -> tuple[str, bool]:
        self.pos += 1 if (action[:1] or "a") < "m" else -1
        return self.observation(), False

    def score(self) -> float:
        return 0.0


@environment("corridor_test")
def _corridor(example: Example) -> Corridor:
    return Corridor()


@pytest.mark.parametrize("beta", [None, 1.0])
def test_only_the_bonus_gives_a_never_rewarded_phase_a_gradient(tiny_backend, tmp_path, beta):
    graph = AgentGraph(nodes=(LoopNode(id="walk", env="corridor_test", max_turns=3, max_tokens=4,
                                       temperature=1.0),), entry="walk", exit="walk")
    exploration = {"exploration": {"kind": "count", "beta": beta}} if beta else {}
    cfg = RLConfig(enabled=True, group_size=4, inputs_per_step=2, steps=2, lr=5e-2, dynamic_sampling=True,
                   **exploration)
    backend = tiny_backend()
    rl = RLPhase(cfg, backend, ExecContext(backend, ToolContext(), seed=0), RewardConfig(), tmp_path, seed=0)
    train = [Example(f"walk-{i}", "position 0", "", {"seed": i}) for i in range(2)]
    metrics = asyncio.run(rl.train([graph], train, generation=1)).metrics
    assert metrics["reward_mean"] == 0.0 and metrics["group_signal_share"] == 0.0
    if beta is None:
        assert metrics["steps_trained"] == 0 and rl.explorer is None
    else:
        assert metrics["shaped_group_signal_share"] > 0 and metrics["steps_trained"] >= 1
        assert sum(rl.explorer.state().values()) == 2 * 2 * 4 * 3  # steps x inputs x group x turns


def test_with_oversampling_the_bonus_decides_which_inputs_train(tiny_backend, tmp_path):
    """Oversampling keeps the inputs whose samples disagree; without a reward, only the bonus
    can make them disagree, so only with it does any input train."""
    graph = AgentGraph(nodes=(LoopNode(id="walk", env="corridor_test", max_turns=3, max_tokens=4,
                                       temperature=1.0),), entry="walk", exit="walk")
    train = [Example(f"walk-{i}", "position 0", "", {"seed": i}) for i in range(4)]
    steps = {}
    for beta in (None, 1.0):
        exploration = {"exploration": {"kind": "count", "beta": beta}} if beta else {}
        cfg = RLConfig(enabled=True, group_size=4, inputs_per_step=1, oversample=2, steps=1, lr=5e-2,
                       **exploration)
        backend = tiny_backend()
        rl = RLPhase(cfg, backend, ExecContext(backend, ToolContext(), seed=0), RewardConfig(), tmp_path, seed=0)
        steps[beta] = asyncio.run(rl.train([graph], train, generation=1)).metrics["steps_trained"]
    assert steps == {None: 0.0, 1.0: 1.0}
