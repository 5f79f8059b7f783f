"""Budgets in model completions: what the backends count, ``evolve.max_calls`` stopping the
search (and staying spent across ``--resume``), and ``evolve.children: 0`` (RL phases alone)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from evoagent import runner
from evoagent.archive import Archive
from evoagent.check import check_spec
from evoagent.evolve.loop import Search
from evoagent.llm.scripted import ScriptedBackend
from evoagent.llm.types import GenerationRequest
from evoagent.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]

SPEC = f"""
name: budget
seed: 1
task:
  description: arithmetic
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 40,
            options: {{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}}}
  splits: {{train: 4, val: 6, test: 6}}
  tools: [calculator]
graphs: [{ROOT}/graphs/direct.yaml, {ROOT}/graphs/cot.yaml]
policy: {{kind: scripted}}
evolve:
  generations: 20
  children: 2
  max_calls: 20
  operators: [{{name: insert_tool}}, {{name: reflective_rewrite}}]
  cascade: {{minibatch: 2}}
"""


def search(tmp_path: Path, text: str = SPEC) -> tuple[object, ScriptedBackend]:
    (tmp_path / "task.yaml").write_text(text)
    spec = load_spec(tmp_path / "task.yaml").model_copy(update={"output": str(tmp_path / "pop")})
    check_spec(spec)
    policy = ScriptedBackend()
    with Archive(spec.run_dir) as archive:
        result = asyncio.run(Search(spec, policy, policy, archive).run())
    return result, policy


def test_the_search_stops_once_its_budget_of_completions_is_spent(tmp_path):
    result, policy = search(tmp_path)
    # seeds: 2 agents x 6 val = 12 completions; one generation passes 20; the test comes after
    assert 1 <= result.generations < 20
    assert result.calls >= 20 and result.calls == policy.usage.calls - 6
    assert result.tokens == policy.usage.tokens - sum(
        len(r.messages[-1]["content"].encode()) for r in policy.requests[-6:]
    )
    with Archive(tmp_path / "pop" / "budget", write=False) as a:
        assert a.usage()[0] == result.calls  # persisted with the last generation
        assert [g["generation"] for g in a.generations()][-1] == result.generations


def test_a_resumed_run_goes_on_from_what_was_spent_not_from_a_fresh_budget(tmp_path):
    first, _ = search(tmp_path)
    again, policy = search(tmp_path)  # the archive exists: the search resumes
    assert again.generations == first.generations and policy.usage.calls == 0
    more, policy = search(tmp_path, SPEC.replace("max_calls: 20", "max_calls: 60"))
    assert more.generations > first.generations and more.calls >= 60


def test_the_hf_backend_counts_what_the_model_generated_not_cache_hits(tiny_backend):
    backend = tiny_backend(cache=True)
    req = GenerationRequest(({"role": "user", "content": "2 + 2"},), max_tokens=5)
    first = asyncio.run(backend.generate([req]))
    asyncio.run(backend.generate([req, req]))
    assert backend.usage.calls == 1 and backend.usage.tokens == len(first[0].completion_ids)


def test_zero_children_runs_the_rl_phases_on_the_seeds_alone(tmp_path, tiny_model_dir):
    text = SPEC.replace("policy: {kind: scripted}", f"policy: {{kind: hf, model: {tiny_model_dir}, dtype: float32}}")
    text = text.replace("generations: 20", "generations: 2").replace("children: 2", "children: 0")
    text = text.replace("  max_calls: 20\n", "")
    text += "rl: {enabled: true, every: 1, steps: 1, group_size: 2, inputs_per_step: 2}\n"
    (tmp_path / "task.yaml").write_text(text)
    spec = runner.prepare(tmp_path / "task.yaml", output=str(tmp_path / "pop"))
    result = asyncio.run(runner.run(spec))
    assert result.weights_version == 2 and result.generations == 2
    with Archive(result.run_dir, write=False) as a:
        assert {r.operator for r in a.agents()} == {"seed"}
        assert [c["weights_version"] for c in a.checkpoints()] == [1, 2]
