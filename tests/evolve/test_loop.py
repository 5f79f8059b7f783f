"""The search loop on a scripted policy: children that use the calculator win, invalid and
crashed children are archived with reasons, and an interrupted run resumes to the same end."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

import evoagent
from evoagent.archive import Archive
from evoagent.check import check_spec
from evoagent.evolve.hooks import NullReporter
from evoagent.evolve.loop import Search
from evoagent.llm.scripted import ScriptedBackend
from evoagent.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]


@evoagent.mutation("test_crash")
def crash(parents, ctx):
    raise ZeroDivisionError("operator bug")


@evoagent.mutation("test_cycle")
def cycle(parents, ctx):
    """A buggy structural operator: an edge back from the exit to the entry."""
    from evoagent.graph.model import Edge

    g = parents[0]
    return g.model_copy(update={"edges": (*g.edges, Edge(src=g.exit, dst=g.entry))})


@evoagent.mutation("test_empty_prompt")
def empty_prompt(parents, ctx):
    """What a mutator LLM that answers nothing would produce as a new template."""
    g = parents[0]
    return g.replace_node(g.node(g.exit).model_copy(update={"template": "  "}))


@evoagent.mutation("test_garbage")
def garbage(parents, ctx):
    """An operator that passes the LLM's raw reply on instead of a graph."""
    return "\x00\ufffd not a graph {input"


SPEC = f"""
name: loop
seed: 3
task:
  description: arithmetic
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 40,
            options: {{min_terms: 2, max_terms: 2, min_digits: 2, max_digits: 2}}}}
  splits: {{train: 4, val: 6, test: 6}}
  tools: [calculator]
graphs: [{ROOT}/graphs/direct.yaml, {ROOT}/graphs/cot.yaml]
policy: {{kind: scripted}}
evolve:
  generations: 3
  children: 3
  operators: [{{name: insert_tool, weight: 3}}, {{name: bootstrap_demos}}, {{name: test_crash, weight: 2}},
              {{name: param_search}}, {{name: add_node}}]
  cascade: {{minibatch: 2}}
"""


def calculator_reader(request) -> str:
    """A 'model' that is right exactly when a calculator result is in its prompt."""
    m = re.search(r"calculator result: (-?[\d.]+)", request.messages[-1]["content"])
    return f"The answer is {m.group(1)}" if m else "I think 7"


def run_search(tmp_path: Path, reporter=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "task.yaml").write_text(SPEC)
    spec = load_spec(tmp_path / "task.yaml").model_copy(update={"output": str(tmp_path / "pop")})
    check_spec(spec)
    policy = ScriptedBackend(handler=calculator_reader)
    with Archive(spec.run_dir) as archive:
        result = asyncio.run(Search(spec, policy, policy, archive, reporter).run())
    return spec, result


def test_search_finds_the_calculator_and_archives_failures(tmp_path):
    spec, result = run_search(tmp_path)
    assert result.seed_val == 0.0 and result.best_val == 1.0 and result.test == 1.0
    with Archive(spec.run_dir, write=False) as a:
        best = a.agent(result.best_id)
        assert best.operator == "insert_tool" and best.parents
        statuses = {r.status for r in a.agents()}
        crashed = [r for r in a.agents() if r.status == "crashed"]
        assert "crashed" in statuses and "ZeroDivisionError: operator bug" in crashed[0].reason
        invalid = [r for r in a.agents() if r.status == "invalid"]
        assert all(r.reason for r in invalid)
        assert [g["generation"] for g in a.generations()] == [0, 1, 2, 3]


class InterruptAt(NullReporter):
    """Ctrl-C in the middle of a generation (when its first child is logged)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def log(self, message: str) -> None:
        if message.startswith(self.prefix):
            raise KeyboardInterrupt


def test_interrupt_then_resume_ends_where_an_uninterrupted_run_ends(tmp_path, snapshot):
    _, ref = run_search(tmp_path / "ref")
    with pytest.raises(KeyboardInterrupt):
        run_search(tmp_path / "cut", InterruptAt("gen 2:"))
    with Archive(tmp_path / "cut" / "pop" / "loop", write=False) as a:
        assert a.last_generation() == (1, 0)  # generation 2 never half-landed
    _, resumed = run_search(tmp_path / "cut")
    assert resumed.best_id == ref.best_id and resumed.test == ref.test
    assert snapshot(tmp_path / "cut" / "pop" / "loop") == snapshot(tmp_path / "ref" / "pop" / "loop")


def test_resume_refuses_a_changed_spec_but_lets_the_search_go_on_longer(tmp_path):
    from evoagent import runner
    from evoagent.errors import ArchiveError

    spec, _ = run_search(tmp_path)
    task = tmp_path / "task.yaml"
    out = str(tmp_path / "pop")
    task.write_text(SPEC.replace("children: 3", "children: 5"))
    with pytest.raises(ArchiveError, match=r"evolve\.children: 3 -> 5.*only \['base_dir', 'evolve\.generations', 'evolve\.max_calls', 'output'\]"):
        runner.prepare(task, output=out, resume=True)
    task.write_text(SPEC.replace("generations: 3", "generations: 4"))
    longer = runner.prepare(task, output=out, resume=True)
    assert longer.evolve.generations == 4


def test_operators_that_return_broken_graphs_are_archived_invalid_and_the_run_goes_on(tmp_path):
    from evoagent.llm.scripted import ScriptedBackend

    text = SPEC.replace(
        "operators: [{name: insert_tool, weight: 3}, {name: bootstrap_demos}, {name: test_crash, weight: 2},\n"
        "              {name: param_search}, {name: add_node}]",
        "operators: [{name: test_cycle}, {name: test_empty_prompt}, {name: test_garbage}]",
    )
    assert text != SPEC
    (tmp_path / "task.yaml").write_text(text)
    spec = load_spec(tmp_path / "task.yaml").model_copy(update={"output": str(tmp_path / "pop")})
    check_spec(spec)
    policy = ScriptedBackend(handler=calculator_reader)
    with Archive(spec.run_dir) as archive:
        result = asyncio.run(Search(spec, policy, policy, archive).run())
        reasons = [r.reason for r in archive.agents("invalid")]
    assert result.generations == 3
    assert any("graph has a cycle" in r or "cannot feed itself" in r for r in reasons), reasons
    assert any("empty prompt template" in r for r in reasons)
    assert any("returned str, not AgentGraph" in r for r in reasons)


def test_a_crash_while_seeding_leaves_one_run_row(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run_search(tmp_path, InterruptAt("seed "))
    spec, result = run_search(tmp_path)
    with Archive(spec.run_dir, write=False) as a:
        assert a.db.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
        assert [g["generation"] for g in a.generations()] == [0, 1, 2, 3]


@pytest.mark.parametrize("reply", ["", "9" * 5000])
def test_a_model_that_says_nothing_or_never_stops_still_gives_a_finished_run(tmp_path, reply):
    from evoagent.llm.scripted import ScriptedBackend

    (tmp_path / "task.yaml").write_text(SPEC)
    spec = load_spec(tmp_path / "task.yaml").model_copy(update={"output": str(tmp_path / "pop")})
    check_spec(spec)
    policy = ScriptedBackend(handler=lambda r: reply)  # cut at the node's max_tokens budget
    with Archive(spec.run_dir) as archive:
        result = asyncio.run(Search(spec, policy, policy, archive).run())
        trajs = list(archive.trajectories(result.best_id, "val"))
    assert result.generations == 3 and result.best_val == 0.0 and result.test == 0.0
    assert trajs and all(t.reward == 0.0 for t in trajs)


SEEN: list[frozenset[str]] = []  # per test_seen call: the weights versions of what it was shown


@evoagent.mutation("test_seen")
async def seen(parents, ctx):
    """Records which weights version the parent's executions it was shown came from (async:
    it runs in this process, where SEEN is)."""
    shown = ctx.failures + ctx.successes
    SEEN.append(frozenset(f.output.split(":")[0] for f in shown))
    g = parents[0]
    return g.replace_node(g.node(g.exit).model_copy(update={"system": f"variant {ctx.rng.random()}"}))


class FakeRL:
    """An RL phase that trains nothing: each phase only bumps the weights version."""

    explorer = None  # no exploration bonus

    def __init__(self, root: Path) -> None:
        self.root = root

    async def train(self, elite, train, generation, on_step=None, reserve=(), reused=()):
        from types import SimpleNamespace

        path = self.root / f"ckpt-{generation}"
        path.mkdir(parents=True, exist_ok=True)
        metrics = {"steps_trained": 1, "reward_mean": 0.0, "per_step": []}
        return SimpleNamespace(checkpoint=str(path), metrics=metrics, rollouts=[], archive=False)

    def restore(self, path, version): ...

    def rollback(self, path, version): ...

    def weights(self):
        return {}


def test_after_an_rl_phase_every_agent_stays_selectable_and_is_rescored_when_drawn(tmp_path):
    """The RL phase re-scores only the top agents; the rest keep their score, marked with its
    version, and a parent drawn with a stale score is re-scored under the new weights before
    its operator runs, which then sees executions under those weights only."""
    text = SPEC.replace(
        "operators: [{name: insert_tool, weight: 3}, {name: bootstrap_demos}, {name: test_crash, weight: 2},\n"
        "              {name: param_search}, {name: add_node}]",
        "operators: [{name: test_seen}]\n  selection: {islands: 1}",
    ).replace("children: 3", "children: 6").replace("minibatch: 2", "minibatch: 6")
    text += "rl: {enabled: true, every: 1, elite: 1, steps: 1}\n"
    (tmp_path / "task.yaml").write_text(text)
    spec = load_spec(tmp_path / "task.yaml").model_copy(update={"output": str(tmp_path / "pop")})
    policy = ScriptedBackend(handler=lambda r: f"v{policy.weights_version}: I think 7")
    logs: list[str] = []
    reporter = type("Log", (NullReporter,), {"log": lambda self, m: logs.append(m)})()
    SEEN.clear()
    with Archive(spec.run_dir) as archive:
        result = asyncio.run(Search(spec, policy, policy, archive, reporter, FakeRL(tmp_path)).run())
        assert result.weights_version == 2  # no phase after the last generation
        ok = {a.id for a in archive.agents("ok")}
        scored = {r[0] for r in archive.db.execute(
            "SELECT DISTINCT agent_id FROM evaluations WHERE split='val' AND stage='full'")}
        pool = archive.candidates("val", 2)
        assert {c[0] for c in pool} == ok & scored and len(pool) > 4  # more than the re-scored top
        assert {c[5] for c in pool} > {2}  # stale scores are kept, with their version
        rescored = [m for m in logs if re.match(r"gen \d: parent \w+ val .* \(v\d\) -> .* \(v\d\)", m)]
        assert rescored
        for m in rescored:
            gen, pid = re.match(r"gen (\d): parent (\w+)", m).groups()
            trajs = list(archive.trajectories(pid, "val", int(gen) - 1))
            assert len(trajs) == 6 and all(t.output.startswith(f"v{int(gen) - 1}:") for t in trajs)
    assert set().union(*SEEN) == {"v0", "v1", "v2"}
    assert all(len(shown) == 1 for shown in SEEN)  # never a mix of versions


def test_a_run_begun_before_a_setting_existed_still_resumes(tmp_path):
    """The archive keeps the spec as it was dumped then: a setting added since (an operator's
    params, policy.max_adapter_copies) is not a change, but a default that moved is, by name."""
    import json

    from evoagent import runner
    from evoagent.spec.config import RunSpec

    (tmp_path / "task.yaml").write_text(SPEC)
    spec = load_spec(tmp_path / "task.yaml")
    stored = spec.model_dump(mode="json")
    del stored["policy"]["max_adapter_copies"]
    for op in stored["evolve"]["operators"]:
        del op["params"]
    assert runner.spec_changes(json.dumps(stored), spec) == []
    stored["evolve"]["operator_policy"]["kind"] = "fixed" if spec.evolve.operator_policy.kind != "fixed" else "adaptive"
    (change,) = runner.spec_changes(json.dumps(stored), RunSpec.model_validate(spec.model_dump()))
    assert change.startswith("evolve.operator_policy.kind: ")
