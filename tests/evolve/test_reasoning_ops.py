"""decompose, best_of_n and reflexion_retry: valid graphs with the promised structure, whose
new nodes run in order and see what they should."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from evoagent.errors import MutationError
from evoagent.evolve.catalog import get_operator
from evoagent.evolve.operators import MutationContext
from evoagent.evolve.reasoning_ops import PLAN_SYSTEM, REFLECT_SYSTEM, RETRY_SYSTEM
from evoagent.execute.executor import ExecContext, execute
from evoagent.graph import LLMNode, VoteNode, load_graph, validate
from evoagent.llm.scripted import ScriptedBackend
from evoagent.tasks.datasets import Example
from evoagent.tools import ToolContext, known_tools

ROOT = Path(__file__).resolve().parents[2]
DIRECT = load_graph(ROOT / "graphs" / "direct.yaml")
COT = load_graph(ROOT / "graphs" / "cot.yaml")
QUESTION = "Ana has 17 pens and buys 25 more, then gives away 3. How many pens does she have?"


def apply(name: str, graph, **kw):
    ctx = MutationContext(llm=ScriptedBackend(), rng=random.Random(0), task="word problems", **kw)
    return validate(asyncio.run(get_operator(name).apply([graph], ctx)), known_tools())


def run(graph, handler):
    backend = ScriptedBackend(handler=handler)
    t = asyncio.run(execute(graph, Example("q", QUESTION, "39"), ExecContext(backend, ToolContext(), seed=0)))
    return t, backend


def by_system(request) -> str:
    system = next((m["content"] for m in request.messages if m["role"] == "system"), "")
    return {PLAN_SYSTEM: "1. 17 + 25 = 42\n2. 42 - 3 = 39", REFLECT_SYSTEM: "The attempt forgot the 3 pens given away.",
            RETRY_SYSTEM: "39"}.get(system, "42")


def test_decompose_plans_before_the_node_solves():
    child = apply("decompose", DIRECT)
    plan = next(n for n in child.nodes if isinstance(n, LLMNode) and n.system == PLAN_SYSTEM)
    assert child.entry == plan.id and "{" + plan.id + "}" in child.node("answer").template
    t, backend = run(child, by_system)
    solver_prompt = backend.requests[-1].messages[-1]["content"]
    assert "42 - 3 = 39" in solver_prompt  # the solver reads the plan
    assert [s.node for s in t.llm_steps] == [plan.id, "answer"]
    with pytest.raises(MutationError, match="already reads a plan"):
        apply("decompose", child)


def test_best_of_n_samples_and_votes_with_the_tasks_extractor():
    child = apply("best_of_n", DIRECT, extract="last_number")
    vote = child.node(child.exit)
    assert isinstance(vote, VoteNode) and vote.extract == "last_number"
    answer = child.node("answer")
    assert answer.samples == 5 and answer.temperature >= 0.7
    long = COT.replace_node(COT.node(COT.exit).model_copy(update={"max_tokens": 256}))
    assert apply("best_of_n", long).node(COT.exit).samples == 3  # fewer samples of long replies
    votes = iter(["41", "39", "39", "12", "39"])
    t, _ = run(child, lambda r: next(votes))
    assert t.output.strip() == "39" and len(t.llm_steps) == 5
    with pytest.raises(MutationError, match="already sampled or voted"):
        apply("best_of_n", child)


def test_reflexion_retry_reflects_on_the_attempt_then_answers_again():
    child = apply("reflexion_retry", DIRECT)
    retry = child.node(child.exit)
    assert isinstance(retry, LLMNode) and retry.system == RETRY_SYSTEM
    t, backend = run(child, by_system)
    assert [s.text for s in t.llm_steps] == ["42", "The attempt forgot the 3 pens given away.", "39"]
    assert "forgot the 3 pens" in backend.requests[-1].messages[-1]["content"] and t.output == "39"
    with pytest.raises(MutationError, match="already has a retry"):
        apply("reflexion_retry", child)
