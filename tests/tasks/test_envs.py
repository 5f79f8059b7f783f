"""textarena games as a dataset and an environment a loop node plays; bad env references fail
with the node's name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from evoagent.errors import GraphError, SpecError
from evoagent.execute.evaluate import run_and_score
from evoagent.execute.executor import ExecContext
from evoagent.execute.trajectory import ToolStep
from evoagent.graph import load_graph
from evoagent.graph.model import AgentGraph, LoopNode
from evoagent.graph.validate import validate
from evoagent.llm.scripted import ScriptedBackend
from evoagent.spec.config import DatasetConfig, RewardConfig
from evoagent.tasks.datasets import load_examples
from evoagent.tasks.envs import known_environments
from evoagent.tools import ToolContext

pytest.importorskip("textarena")
ROOT = Path(__file__).resolve().parents[2]


def games(n: int = 3):
    return load_examples(DatasetConfig(kind="textarena", name="FrozenLake-v0-train", size=n), 1, ROOT)


def test_dataset_is_seeded_boards_with_the_first_observation():
    a, b = games(), games()
    assert [e.id for e in a] == [e.id for e in b] == [f"FrozenLake-v0-train-{100_000 + k}" for k in range(3)]
    assert all("Current Board" in e.input and e.meta["env_id"] == "FrozenLake-v0-train" for e in a)
    with pytest.raises(SpecError, match="task.dataset.name"):
        load_examples(DatasetConfig(kind="textarena", name="Wordle-v0"), 0, ROOT)


def play(moves: list[str], example):
    replies = iter(moves * 10)
    backend = ScriptedBackend(handler=lambda req: next(replies))
    graph = load_graph(ROOT / "examples" / "frozenlake" / "play.yaml")
    ctx = ExecContext(backend, ToolContext())
    return asyncio.run(run_and_score(graph, example, ctx, RewardConfig())), backend


def test_a_loop_plays_the_episode_and_the_game_scores_it():
    board = games(1)[0]
    traj, backend = play(["I think [down]", "[right]"], board)
    assert traj.error is None
    moves = [s for s in traj.steps if isinstance(s, ToolStep)]
    assert moves and all(s.tool == "env:textarena" for s in moves)
    assert 0.0 <= traj.env_reward <= 1.0 and traj.reward == traj.env_reward
    # later turns are token-in: each request extends the previous prompt and completion
    later = backend.requests[1:]
    assert later and all(r.prefix_ids is not None for r in later)
    # the rules are not repeated in later observations, only what changed
    assert "Welcome to Frozen Lake" not in moves[0].output


def test_without_partial_credit_only_a_win_scores():
    partial = games(4)
    sparse = load_examples(DatasetConfig(kind="textarena", name="FrozenLake-v0-train", size=4,
                                         options={"partial_credit": False}), 1, ROOT)
    assert [e.input for e in sparse] == [e.input for e in partial]
    moves = ["[down]", "[right]", "[down]", "[right]", "[down]", "[right]"]
    with_credit = [play(moves, e)[0].env_reward for e in partial]
    without = [play(moves, e)[0].env_reward for e in sparse]
    assert without == [float(r >= 1.0) for r in with_credit]
    assert any(0.0 < r < 1.0 for r in with_credit)  # the same walks earned partial credit
    with pytest.raises(SpecError, match=r"task\.dataset\.options: textarena knows only 'partial_credit'"):
        load_examples(DatasetConfig(kind="textarena", name="FrozenLake-v0-train", size=1,
                                    options={"slippery": True}), 1, ROOT)
    with pytest.raises(SpecError, match=r"task\.dataset\.options\.partial_credit: true or false"):
        load_examples(DatasetConfig(kind="textarena", name="FrozenLake-v0-train", size=1,
                                    options={"partial_credit": "no"}), 1, ROOT)


def test_two_invalid_moves_end_the_game_with_zero():
    traj, _ = play(["no idea"], games(1)[0])
    assert traj.reward == 0.0 and len(traj.llm_steps) == 2
    assert "Game over" in traj.output


def test_bad_env_references_name_the_node():
    with pytest.raises(GraphError, match=r"node 'p'.*unknown env 'chess'.*textarena"):
        validate(AgentGraph(nodes=(LoopNode(id="p", env="chess"),), entry="p", exit="p"), tools=[],
                 envs=known_environments())
    with pytest.raises(GraphError, match="either an env or tools"):
        validate(AgentGraph(nodes=(LoopNode(id="p", env="textarena", tools=("calculator",)),),
                            entry="p", exit="p"), tools=["calculator"])


def test_the_frozenlake_example_spec_is_valid():
    from evoagent.check import check_spec
    from evoagent.spec import load_spec

    spec = load_spec(ROOT / "examples" / "frozenlake" / "task.yaml")
    check_spec(spec)
    assert spec.rl.algorithm == "gigpo" and spec.task.dataset.kind == "textarena"


def test_episodes_in_threads_get_their_own_board_and_leave_random_alone():
    import random
    from concurrent.futures import ThreadPoolExecutor

    from evoagent.tasks.envs import TextArenaEpisode

    random.seed(123)
    want = random.random()
    random.seed(123)
    with ThreadPoolExecutor(8) as pool:
        firsts = list(pool.map(
            lambda s: TextArenaEpisode("FrozenLake-v0-train", s).observation(), [5, 6] * 12))
    assert random.random() == want  # textarena's random.seed did not leak out
    assert len(set(firsts[0::2])) == 1 and len(set(firsts[1::2])) == 1


def test_an_env_loop_on_a_dataset_it_cannot_play_fails_at_spec_time(tmp_path):
    from evoagent.check import check_spec
    from evoagent.spec import load_spec

    (tmp_path / "task.yaml").write_text(f"""
name: t
task:
  description: sums
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 20}}
  splits: {{train: 2, val: 2, test: 2}}
graphs: [{ROOT}/examples/frozenlake/play.yaml]
""")
    with pytest.raises(SpecError, match=r"graphs\[0\] node 'play': env 'textarena' cannot play"):
        check_spec(load_spec(tmp_path / "task.yaml"))


def test_adding_the_env_field_kept_archived_ids():
    # the id react.yaml had before LoopNode.env existed: archives made then still resume
    assert load_graph(ROOT / "graphs" / "react.yaml").id == "fee7d7db8b02"


def test_replay_by_example_id_plays_that_board(tmp_path):
    import json

    from typer.testing import CliRunner

    from evoagent.archive import Archive
    from evoagent.cli import app

    (tmp_path / "task.yaml").write_text(f"""
name: lake
task:
  description: FrozenLake
  dataset: {{kind: textarena, name: FrozenLake-v0-train, size: 4}}
  splits: {{train: 0, val: 2, test: 0}}
graphs: [{ROOT}/examples/frozenlake/play.yaml]
policy: {{kind: scripted}}
evolve: {{generations: 0}}
""")
    cli = CliRunner()
    res = cli.invoke(app, ["run", str(tmp_path / "task.yaml"), "--output", str(tmp_path / "pop"),
                           "--progress", "quiet"])
    assert res.exit_code == 0, res.output
    run_dir = tmp_path / "pop" / "lake"
    with Archive(run_dir, write=False) as a:
        (seed,) = a.agents()
    # the scripted policy echoes the prompt, whose first bracketed move is [down]: a real game
    res = cli.invoke(app, ["archive", "replay", str(run_dir), seed.id, "--input",
                           "FrozenLake-v0-train-2", "--json"])
    assert res.exit_code == 0, res.output
    traj = json.loads(res.output)
    assert traj["input_id"] == "FrozenLake-v0-train-2" and traj["error"] is None
    assert [s["tool"] for s in traj["steps"] if s["kind"] == "tool"][0] == "env:textarena"
    assert traj["env_reward"] is not None
