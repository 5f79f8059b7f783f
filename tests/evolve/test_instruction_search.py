"""``instruction_demo_search`` (MIPROv2-style): TPE finds the instruction and demo set that work
together, every pair is scored on the same train inputs, a pair is never paid for twice, and a
search that finds nothing better says so."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from evoagent.errors import MutationError
from evoagent.evolve.catalog import get_operator
from evoagent.evolve.instruction_search import InstructionDemoSettings, needs_train
from evoagent.evolve.operators import Feedback, MutationContext, TraceStep
from evoagent.graph import load_graph
from evoagent.llm.scripted import ScriptedBackend
from evoagent.spec.config import RunSpec

ROOT = Path(__file__).resolve().parents[2]
DIRECT = load_graph(ROOT / "graphs" / "direct.yaml")
NODE = DIRECT.nodes[0].id


def success(question: str, reply: str) -> Feedback:
    return Feedback(question, reply, reply, 1.0, None, (TraceStep(NODE, "llm", question, reply),))


def context(score, instructions: list[str], trials: int = 12) -> tuple[MutationContext, list]:
    """A context whose mutator proposes ``instructions`` in turn and whose ``evaluate`` scores a
    graph with ``score(node)``, recording the rng state each call starts from."""
    replies = iter(instructions * 4)
    calls: list = []
    rng = random.Random(0)

    async def evaluate(graph, n):
        calls.append((rng.getstate(), graph.id))
        rng.random()  # drawing inputs advances the state, as the breeder's draw does
        return [score(graph.node(NODE))] * n

    ctx = MutationContext(
        llm=ScriptedBackend(handler=lambda r: next(replies)), rng=rng, task="add numbers",
        successes=(success("Calculate 2 + 2.", "4"), success("Calculate 3 + 5.", "8")), max_demos=1,
        evaluate=evaluate, settings=InstructionDemoSettings(instructions=3, demo_sets=2, trials=trials, inputs=4),
    )
    return ctx, calls


def test_the_pair_that_works_together_wins_on_the_same_inputs_paid_once():
    def score(node) -> float:  # the instruction helps only with a demo beside it
        return 1.0 if "step by step" in node.system and node.demos else 0.25

    ctx, calls = context(score, ["Be brief.", "Work step by step, then answer.", "Answer in words."])
    child = asyncio.run(get_operator("instruction_demo_search").apply([DIRECT], ctx))
    node = child.node(NODE)
    assert "step by step" in node.system and len(node.demos) == 1
    assert node.demos[0].input in ("Calculate 2 + 2.", "Calculate 3 + 5.")
    assert len({state for state, _ in calls}) == 1  # every pair saw the same train inputs
    assert len({g for _, g in calls}) == len(calls) <= 12  # no pair scored twice


def test_a_search_that_beats_nothing_says_so():
    ctx, _ = context(lambda node: 0.5, ["Be brief.", "Answer.", "Think."], trials=4)
    with pytest.raises(MutationError, match="no pair beat node .*'s own instruction and demos on 4 train inputs"):
        asyncio.run(get_operator("instruction_demo_search").apply([DIRECT], ctx))


def test_a_task_without_train_inputs_is_refused_at_spec_time():
    spec = RunSpec.model_validate({
        "name": "x", "task": {"description": "d", "dataset": {"kind": "reasoning_gym", "name": "basic_arithmetic"},
                              "splits": {"train": 0, "val": 4, "test": 4}},
        "graphs": [str(ROOT / "graphs" / "direct.yaml")], "policy": {"kind": "scripted"},
    })
    assert "task.splits.train is 0" in needs_train([DIRECT], spec)


def test_in_a_run_the_found_pair_is_archived_and_its_trials_count_toward_the_budget(tmp_path):
    import re

    from evoagent.archive import Archive
    from evoagent.evolve.hooks import NullReporter
    from evoagent.evolve.loop import Search
    from evoagent.spec import load_spec

    (tmp_path / "task.yaml").write_text(f"""
name: mipro
seed: 1
task:
  description: arithmetic
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 60,
            options: {{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}}}
  splits: {{train: 8, val: 8, test: 4}}
graphs: [{ROOT}/graphs/direct.yaml]
policy: {{kind: scripted}}
evolve:
  generations: 1
  children: 1
  operators: [{{name: instruction_demo_search, params: {{instructions: 2, demo_sets: 1, trials: 4, inputs: 3}}}}]
""")

    def policy_reply(request) -> str:
        system = request.messages[0]["content"] if request.messages[0]["role"] == "system" else ""
        m = re.search(r"Calculate ([-+*/() \d]+)\.", request.messages[-1]["content"])
        return str(round(eval(m.group(1)))) if m and "carefully" in system else "7"  # noqa: S307

    spec = load_spec(tmp_path / "task.yaml").model_copy(update={"output": str(tmp_path / "pop")})
    policy = ScriptedBackend(handler=policy_reply)
    mutator = ScriptedBackend(handler=lambda r: "Compute the result carefully and reply with the number.")
    with Archive(spec.run_dir) as archive:
        result = asyncio.run(Search(spec, policy, mutator, archive, NullReporter()).run())
        (child,) = archive.agents(operator="instruction_demo_search")
    assert child.status == "ok" and "carefully" in child.graph.node(NODE).system
    assert result.best_id == child.id and result.best_val == 1.0
    # the trials ran on train inputs, with the policy (so they count toward evolve.max_calls)
    from evoagent.tasks.datasets import task_data

    train = {e.input for e in task_data(spec.task, spec.seed, Path(spec.base_dir))[1]["train"]}
    asked = [r.messages[-1]["content"] for r in policy.requests]
    assert sum(q in train for q in asked) >= 3
    assert mutator.usage.calls == 2  # the instructions proposed


def test_nothing_to_try_costs_nothing_and_two_draws_of_one_demo_set_are_one_candidate():
    from evoagent.evolve.instruction_search import _demo_sets

    ctx, calls = context(lambda node: 1.0, [""])  # the mutator proposes nothing usable
    ctx = MutationContext(**{**ctx.__dict__, "successes": ()})
    with pytest.raises(MutationError, match="nothing to try for node"):
        asyncio.run(get_operator("instruction_demo_search").apply([DIRECT], ctx))
    assert calls == []  # no execution was paid for
    two, _ = context(lambda node: 1.0, ["x"])
    two = MutationContext(**{**two.__dict__, "max_demos": 2})
    sets = _demo_sets(DIRECT.nodes[0], two, 8)  # the pool holds two demos: every draw is the same set
    assert len(set(sets)) == 1
