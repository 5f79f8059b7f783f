"""The joint loop's schedule on a scripted policy whose answers depend on the weights version it
serves (the RL phase itself trains nothing): the run ends on a search generation, a phase that
made the agents worse is rolled back and said so, and a killed adaptive run resumes to the same
archive."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from evoagent.archive import Archive
from evoagent.cli import app
from evoagent.evolve.hooks import NullReporter
from evoagent.evolve.loop import Search
from evoagent.evolve.pool import Candidate
from evoagent.evolve.rl_turn import RLTurn
from evoagent.llm.scripted import ScriptedBackend
from evoagent.llm.types import GenerationRequest
from evoagent.report import write_report
from evoagent.rl.schedule import RL, SEARCH, recorded
from evoagent.rl.shaping import EXPLORATION_KEY, CountBonus
from evoagent.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = f"""
name: sched
seed: 4
task:
  description: arithmetic
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 40,
            options: {{min_terms: 2, max_terms: 2, min_digits: 2, max_digits: 2}}}}
  splits: {{train: 4, val: 8, test: 4}}
graphs: [{ROOT}/graphs/direct.yaml]
policy: {{kind: scripted}}
evolve:
  generations: GENERATIONS
  children: 2
  operators: [{{name: param_search}}]
  cascade: {{minibatch: MINIBATCH}}
rl: {{enabled: true, every: 1, steps: 1, elite: 1, RL}}
"""


def solve(prompt: str) -> str:
    """The right answer to a ``Calculate a op b.`` question."""
    m = re.search(r"Calculate ([-+*/() \d]+)\.", prompt)
    return str(round(eval(m.group(1)))) if m else "7"  # noqa: S307 (the generator's own digits)


class FakeRL:
    """An RL phase that trains nothing (the policy's answers depend on the version it serves);
    it records the rollbacks it is asked for."""

    explorer = None  # no exploration bonus

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rollbacks: list[tuple[str | None, int]] = []
        self.reused: dict[int, list] = {}

    async def train(self, elite, train, generation, on_step=None, reserve=(), reused=()):
        self.reused[generation] = list(reused)
        metrics = {"steps_trained": 1, "reward_mean": 0.0, "per_step": []}
        return SimpleNamespace(checkpoint=f"ckpt-{generation}", metrics=metrics, rollouts=[], archive=False)

    def restore(self, path, version): ...

    def rollback(self, path, version):
        self.rollbacks.append((path, version))

    def weights(self):
        return {}


class Log(NullReporter):
    def __init__(self, stop_at: str | None = None) -> None:
        self.lines: list[str] = []
        self.stop_at = stop_at

    def log(self, message: str) -> None:
        self.lines.append(message)
        if self.stop_at and message.startswith(self.stop_at):
            raise KeyboardInterrupt


def run(tmp_path: Path, right_under, rl: str = "schedule: fixed", generations: int | str = 4, reporter=None,
        fake_rl=FakeRL):
    """A search whose policy answers right exactly under the versions ``right_under`` accepts."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    text = SPEC.replace("GENERATIONS", str(generations)).replace("RL}", rl + "}")
    text = text.replace("MINIBATCH", "3, first_stage: train" if "reuse_search" in rl else "8")
    text = text.replace("train: 4", "train: 12" if "reuse_search" in rl else "train: 4")
    (tmp_path / "task.yaml").write_text(text)
    spec = load_spec(tmp_path / "task.yaml").model_copy(update={"output": str(tmp_path / "pop")})
    policy = ScriptedBackend(handler=lambda r: solve(r.messages[-1]["content"])
                             if right_under(policy.weights_version) else "I think 7")
    fake, log = fake_rl(tmp_path), reporter or Log()
    fake.policy = policy
    with Archive(spec.run_dir) as archive:
        result = asyncio.run(Search(spec, policy, policy, archive, log, fake).run())
    return spec, result, fake, log


def test_the_run_ends_on_a_search_generation_under_the_final_weights(tmp_path):
    spec, result, _, log = run(tmp_path, lambda v: True, generations=3)
    with Archive(spec.run_dir, write=False) as a:
        kinds = [(s.generation, s.kind) for s in recorded(a)]
        assert [r["weights_version"] for r in a.checkpoints()] == [1, 2]
    assert kinds == [(1, SEARCH), (1, RL), (2, SEARCH), (2, RL), (3, SEARCH)]
    assert result.weights_version == 2
    assert any("no RL phase after the last generation" in m for m in log.lines)


def test_under_a_budget_the_last_step_is_a_search_generation(tmp_path):
    spec, result, _, log = run(tmp_path, lambda v: True, "schedule: fixed", generations="50\n  max_calls: 100")
    with Archive(spec.run_dir, write=False) as a:
        steps = recorded(a)
    assert result.generations < 50 and result.calls >= 100
    assert steps[-1].kind == SEARCH and [s.kind for s in steps].count(RL) >= 1
    assert any("would leave no search generation within evolve.max_calls 100" in m for m in log.lines)


class CostlyRL(FakeRL):
    """A phase that asks the policy for far more completions than any estimate of it."""

    async def train(self, elite, train, generation, on_step=None, reserve=(), reused=()):
        await self.policy.generate([GenerationRequest(({"role": "user", "content": f"x{i}"},), 8, 0.0, i)
                                    for i in range(300)])
        return await super().train(elite, train, generation, on_step, reserve, reused)


def test_a_phase_that_spends_past_the_budget_is_still_followed_by_a_search_generation(tmp_path):
    spec, result, _, log = run(tmp_path, lambda v: True, generations="50\n  max_calls: 150", fake_rl=CostlyRL)
    with Archive(spec.run_dir, write=False) as a:
        kinds = [s.kind for s in recorded(a)]
    assert kinds == [SEARCH, RL, SEARCH] and result.calls > 300
    assert any("ended on an RL phase: one more search generation runs under its weights" in m for m in log.lines)


def test_a_phase_is_priced_by_the_completions_of_the_agents_it_runs_the_reserve_included(tmp_path):
    """A best-of-5 elite asks 5 completions per episode: the generation's average (here mostly
    plain agents, 1 each) would price its phase at a fraction of what it costs. The reserve
    (``spread_agents``) rolls out on every input whose samples agreed, at a low score nearly all:
    priced as if on each, so a phase cannot spend the rest of the budget unforeseen."""
    spec, *_ = run(tmp_path, lambda v: True, generations=1)
    turn = RLTurn.__new__(RLTurn)
    turn.spec, turn.splits = spec, {"val": [None] * 8, "train": [None] * 4}
    pool = [Candidate(a, 1.0 - i / 10, 0, 0, 1) for i, a in enumerate("abcde")]
    turn._ranked = lambda pending, version: (pool, None)
    episode = lambda agent, calls: SimpleNamespace(agent_id=agent, llm_steps=[None] * calls)  # noqa: E731
    pending = SimpleNamespace(version=0, trajectories=[
        ("val", episode("a", 5), 0), ("val", episode("a", 5), 0), ("val", episode("b", 3), 0),
        *(("val", episode(agent, 1), 0) for agent in "cde" for _ in range(4))])
    rl = spec.rl  # steps 1, elite 1; inputs_per_step 4 and group_size 4 by default; 4 re-scored
    episodes = rl.steps * min(rl.inputs_per_step * rl.oversample, 4) * rl.group_size  # per agent rolled out
    assert turn._phase_requests(pending) == episodes * 5 + 8 * (5 + 3 + 1 + 1)
    turn.spec = spec.model_copy(update={"rl": rl.model_copy(update={"spread_agents": 2})})
    assert turn._phase_requests(pending) == episodes * (5 + 3 + 1) + 8 * (5 + 3 + 1 + 1)


def test_a_phase_that_made_the_best_agent_worse_is_rolled_back_and_said_so(tmp_path):
    spec, result, fake, log = run(tmp_path, lambda v: v == 0, generations=3)
    assert fake.rollbacks == [(None, 0), (None, 0)]  # back to the base weights, twice
    assert result.weights_version == 0 and result.best_val == 1.0 and result.test == 1.0
    with Archive(spec.run_dir, write=False) as a:
        phases = a.checkpoints()
        steps = recorded(a)
    assert [r["weights_version"] for r in phases] == [1, 2]  # archived, never served
    assert [s.kept for s in steps if s.kind == RL] == [False, False]
    assert [s.gain for s in steps if s.kind == RL] == [-1.0, -1.0]
    assert any(re.match(r"gen 1: weights v1 rolled back \(val change -1\.000 on 8 paired inputs", m) for m in log.lines)
    shown = CliRunner().invoke(app, ["archive", "show", str(spec.run_dir), result.best_id])
    assert shown.exit_code == 0 and "v1 (rolled back)" in shown.output
    assert "rolled back" in write_report(spec.run_dir).read_text()


def test_a_phase_that_helps_is_kept(tmp_path):
    _, result, fake, _ = run(tmp_path, lambda v: v >= 1, generations=2)
    assert fake.rollbacks == [] and result.weights_version == 1 and result.best_val == 1.0


def test_adaptive_stops_paying_for_phases_that_hurt(tmp_path):
    spec, _, fake, _ = run(tmp_path, lambda v: v == 0, "schedule: adaptive, schedule_explore: 0", generations=6)
    with Archive(spec.run_dir, write=False) as a:
        kinds = [s.kind for s in recorded(a)]
    assert kinds == [SEARCH, RL] + [SEARCH] * 5 and len(fake.rollbacks) == 1


@pytest.mark.parametrize("stop_at", ["gen 3:", "gen 1: weights v1 rolled back"])
def test_a_killed_adaptive_run_resumes_to_the_same_archive(tmp_path, snapshot, stop_at):
    """Killed in a search generation, and in an RL phase's rollback, then resumed."""
    adaptive = "schedule: adaptive, schedule_explore: 0.5"
    # right under v0 and from v2 on: the first phase hurts and is rolled back
    right = lambda v: v != 1  # noqa: E731
    ref, *_ = run(tmp_path / "ref", right, adaptive, generations=6)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut", right, adaptive, generations=6, reporter=Log(stop_at))
    cut, *_ = run(tmp_path / "cut", right, adaptive, generations=6)
    assert snapshot(cut.run_dir) == snapshot(ref.run_dir)
    with Archive(cut.run_dir, write=False) as a, Archive(ref.run_dir, write=False) as b:
        assert recorded(a) == recorded(b)
        assert [dict(r) for r in a.checkpoints()] == [dict(r) for r in b.checkpoints()]


def test_a_train_screen_makes_the_searchs_episodes_training_data_for_the_next_phase(tmp_path):
    """``cascade.first_stage: train`` screens each generation's children on train inputs drawn
    for it; ``rl.reuse_search`` hands those episodes, under the phase's starting weights, to
    the phase."""
    spec, _, fake, _ = run(tmp_path, lambda v: True, "reuse_search: true", generations=3)
    with Archive(spec.run_dir, write=False) as a:
        screened = {}
        for e in a.evaluations():
            if e.stage == "minibatch":
                assert e.split == "train" and e.n == 3
                screened.setdefault(e.generation, set()).update(
                    t.input_id for t in a.trajectories(e.agent_id, "train"))
        children = {g: {r.id for r in a.agents() if r.generation == g and r.status == "ok"} for g in (1, 2)}
        full = [e for e in a.evaluations() if e.stage == "full" and e.split == "val"]
    assert screened[1] != screened[2]  # drawn anew each generation
    for gen in (1, 2):
        assert {t.agent_id for t in fake.reused[gen]} == children[gen]
        assert {t.input_id for t in fake.reused[gen]} == screened[gen]
    assert all(e.n == 8 for e in full)  # passing children are scored on all of val


class CountingRL(FakeRL):
    """A fake phase with a real count explorer, which each phase feeds one visit."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.explorer = CountBonus(0.5)

    async def train(self, elite, train, generation, *args, **kwargs):
        self.explorer.counts[f"state-{generation}"] = generation
        return await super().train(elite, train, generation, *args, **kwargs)


def test_the_exploration_counts_live_in_the_archive_and_a_resumed_run_reads_them(tmp_path):
    spec, _, fake, _ = run(tmp_path, lambda v: True, generations=3, fake_rl=CountingRL)
    with Archive(spec.run_dir) as archive:
        assert archive.meta(EXPLORATION_KEY) == {"state-1": 1, "state-2": 2} == fake.explorer.state()
        policy = ScriptedBackend(handler=lambda r: "7")
        resumed = CountingRL(tmp_path)
        Search(spec, policy, policy, archive, Log(), resumed)
        attached = CountingRL(tmp_path)  # as the runner gives it: after construction
        Search(spec, policy, policy, archive, Log()).attach_rl(attached)
    assert resumed.explorer.state() == {"state-1": 1, "state-2": 2} == attached.explorer.state()
    assert resumed.explorer.bonus([]) == []
