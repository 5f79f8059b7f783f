"""ExpeL's insight memory: the mutator's ADD/EDIT/UPVOTE/DOWNVOTE operations, pairs of a
success and a failure on the same input, the memory kept in the archive across --resume,
injected by use_insights, and carried into a new run of the same task with --memory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from evoagent import runner
from evoagent.archive import Archive
from evoagent.check import check_spec
from evoagent.errors import SpecError
from evoagent.evolve.insights import HEADER, Insight, apply_operations, contrast_pairs
from evoagent.evolve.loop import Search
from evoagent.execute.trajectory import Trajectory
from evoagent.llm.scripted import ScriptedBackend, echo
from evoagent.report import write_report
from evoagent.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = f"""
name: memory
seed: 4
task:
  description: arithmetic
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 40,
            options: {{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}}}
  splits: {{train: 4, val: 6, test: 4}}
  tools: [calculator]
graphs: [{ROOT}/graphs/direct.yaml]
policy: {{kind: scripted}}
evolve:
  generations: 3
  children: 2
  operators: [{{name: insert_tool}}, {{name: use_insights}}]
  cascade: {{minibatch: 2}}
  memory: {{enabled: true, pairs: 2}}
"""
RULE = "Use the calculator result as the final answer."


def mutator(request) -> str:
    """Answers ExpeL's extraction prompt with one rule and some prose; echoes everything else
    (so an answer node that sees the calculator's result ends with the right number)."""
    text = request.messages[-1]["content"]
    if "Reply with operations" in text:
        return f"Here is what I think.\nADD: {RULE}\nUPVOTE 1\nThis rule is general."
    return echo(request)


def search(tmp_path: Path, text: str = SPEC, memory=()):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "task.yaml").write_text(text)
    spec = load_spec(tmp_path / "task.yaml").model_copy(update={"output": str(tmp_path / "pop")})
    check_spec(spec)
    policy = ScriptedBackend(handler=mutator)
    with Archive(spec.run_dir) as archive:
        asyncio.run(Search(spec, policy, policy, archive, memory=memory).run())
    return spec


def test_operations_apply_as_in_expel_and_garbage_is_ignored():
    rules = [Insight("Check units.", 2), Insight("Show steps.", 1)]
    out = apply_operations(rules, "ADD: Re-read the question.\nEDIT 1: Check the units twice.\n"
                                  "DOWNVOTE 2\nI think this is great!\nUPVOTE 9\nADD:", 10)
    assert out == [Insight("Check the units twice.", 3), Insight("Re-read the question.", 2)]  # "Show steps." hit 0
    assert len(apply_operations([], "\n".join(f"ADD: rule {i}" for i in range(30)), 20)) == 20


def test_pairs_set_a_fresh_execution_against_another_agents_on_the_same_input():
    t = lambda agent, inp, r: Trajectory(agent, inp, "q", reward=r)  # noqa: E731
    fresh = [t("child", "a", 1.0), t("child", "b", 0.0), t("child", "c", 1.0)]
    archived = [t("seed", "a", 0.0), t("seed", "b", 1.0), t("seed", "c", 1.0)]
    pairs = contrast_pairs(fresh, archived, 5)
    assert [(g.agent_id, g.input_id, b.agent_id) for g, b in pairs] == [("child", "a", "seed"), ("seed", "b", "child")]


def test_the_memory_is_learned_archived_injected_and_carried_to_a_new_run(tmp_path):
    spec = search(tmp_path / "first")
    with Archive(spec.run_dir, write=False) as a:
        (rule, votes), = a.insights()
        assert rule == RULE and votes > 2  # added once (2 votes), then upvoted by each later pair
        used = [r for r in a.agents(operator="use_insights") if r.status == "ok"]
        assert used and all(HEADER in r.graph.node("answer").system and RULE in r.graph.node("answer").system
                            for r in used)
    assert f"<td style='text-align:left'>{RULE}</td>" in write_report(spec.run_dir).read_text()
    carried = runner.load_memory(spec.run_dir, spec)
    assert carried == Archive(spec.run_dir, write=False).insights()
    other = SPEC.replace("description: arithmetic", "description: something else")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "task.yaml").write_text(other)
    with pytest.raises(SpecError, match=r"--memory: .* is a run of another task \(its task\.description differ"):
        runner.load_memory(spec.run_dir, load_spec(tmp_path / "other" / "task.yaml"))
    second = search(tmp_path / "second", SPEC.replace("memory: {enabled: true, pairs: 2}", "memory: {enabled: true, pairs: 1}")
                    .replace("generations: 3", "generations: 0"), memory=carried)
    with Archive(second.run_dir, write=False) as a:
        assert a.insights() == carried  # a new run starts from them, kept with its seeds
