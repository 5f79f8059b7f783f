"""Search strategies beyond islands and DGM: novelty rejection before evaluation and the
adaptive operator policy (a bandit over operators)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from evoagent.archive import Archive
from evoagent.archive.views import Outcome
from evoagent.check import check_spec
from evoagent.evolve.loop import Search
from evoagent.evolve.novelty import NoveltyIndex
from evoagent.evolve.operator_policy import adaptive, fixed
from evoagent.evolve.operators import Operator
from evoagent.graph import load_graph
from evoagent.llm.scripted import ScriptedBackend
from evoagent.report import write_report
from evoagent.spec import load_spec
from evoagent.spec.config import OperatorPolicyConfig

ROOT = Path(__file__).resolve().parents[2]
DIRECT = load_graph(ROOT / "graphs" / "direct.yaml")

SPEC = f"""
name: strategies
seed: 3
task:
  description: arithmetic
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 40,
            options: {{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}}}
  splits: {{train: 4, val: 6, test: 4}}
graphs: [{ROOT}/graphs/direct.yaml, {ROOT}/graphs/cot.yaml]
policy: {{kind: scripted}}
evolve:
  generations: 1
  children: 2
  operators: [{{name: 'respell:respell'}}]
  cascade: {{minibatch: 2}}
"""
# A mutator that only re-spells the parent's prompt: new punctuation and case, the same words.
RESPELL = '''
async def respell(parents, ctx):
    g = parents[0]
    node = next(n for n in g.nodes if n.kind == "llm")
    return g.replace_node(node.model_copy(update={"system": node.system.upper() + " !!"}))
'''


def run(tmp_path: Path, extra: str = "") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "task.yaml").write_text(SPEC + extra)
    (tmp_path / "respell.py").write_text(RESPELL)
    spec = load_spec(tmp_path / "task.yaml").model_copy(update={"output": str(tmp_path / "pop")})
    check_spec(spec)
    policy = ScriptedBackend()
    with Archive(spec.run_dir) as archive:
        asyncio.run(Search(spec, policy, policy, archive).run())
    return spec.run_dir


def test_novelty_rejects_a_respelled_child_before_evaluating_it(tmp_path):
    run_dir = run(tmp_path / "on", "  novelty_threshold: 0.9\n")
    with Archive(run_dir, write=False) as a:
        seeds = {s.id for s in a.agents(operator="seed")}
        children = a.agents(operator="respell:respell")
        assert children and all(c.status == "duplicate" for c in children)
        for c in children:
            assert c.reason.startswith(f"1.00 similar to {c.parents[0]}") and c.parents[0] in seeds
            assert a.evaluations(c.id) == []  # never run
    run_dir = run(tmp_path / "off")
    with Archive(run_dir, write=False) as a:
        children = a.agents(operator="respell:respell")
        assert children and all(c.status == "ok" and a.evaluations(c.id) for c in children)


def test_novelty_compares_text_within_one_shape():
    index = NoveltyIndex([("d", DIRECT)])
    node = DIRECT.node("answer")
    respelled = DIRECT.replace_node(node.model_copy(update={"system": node.system.lower() + "..."}))
    assert index.nearest(respelled).similarity == 1.0
    hotter = DIRECT.replace_node(node.model_copy(update={"temperature": 0.7}))
    assert index.nearest(hotter) is None  # another shape: always novel
    rewritten = DIRECT.replace_node(node.model_copy(update={"system": "Think in steps, then state the result."}))
    assert index.nearest(rewritten).similarity < 0.5


def outcomes(op: str, improved: list[bool], first_gen: int = 0) -> list[Outcome]:
    return [Outcome(op, first_gen + i, "ok", ok, 10) for i, ok in enumerate(improved)]


def draws(choose, n: int = 400) -> dict[str, int]:
    rng, out = random.Random(0), {}
    for _ in range(n):
        name = choose(rng).name
        out[name] = out.get(name, 0) + 1
    return out


OPS = [(Operator("stale", lambda p, c: p[0]), 1.0), (Operator("useful", lambda p, c: p[0]), 1.0)]


def test_the_adaptive_policy_moves_slots_to_the_operator_that_still_improves():
    history = outcomes("stale", [False] * 10) + outcomes("useful", [True, False] * 5)
    got = draws(adaptive(OPS, history, 10, OperatorPolicyConfig(kind="adaptive")))
    assert got["useful"] > 0.7 * sum(got.values())
    as_configured = draws(fixed(OPS, history, 10, OperatorPolicyConfig()))
    assert 0.4 < as_configured["useful"] / 400 < 0.6


def test_the_adaptive_policy_forgets_what_an_operator_did_long_ago():
    # "stale" improved every time in generations 0-4, never since; "useful" sometimes, lately
    history = outcomes("stale", [True] * 5 + [False] * 5) + outcomes("useful", [False, True] * 2, first_gen=6)
    forgetting = draws(adaptive(OPS, history, 10, OperatorPolicyConfig(kind="adaptive", discount=0.5)))
    remembering = draws(adaptive(OPS, history, 10, OperatorPolicyConfig(kind="adaptive", discount=1.0)))
    assert forgetting["useful"] > 0.6 * 400 and forgetting["useful"] > remembering.get("useful", 0)


def cand(agent_id: str, score: float, generation: int = 1):
    from evoagent.evolve.pool import Candidate

    return Candidate(agent_id, score, 0, 0, generation)


def picks(kind: str, pool, cfg=None, n: int = 300) -> dict[str, int]:
    from evoagent.evolve.selection import get_selector
    from evoagent.spec.config import SelectionConfig

    out: dict[str, int] = {}
    for s in range(n):
        (first, *_), _ = get_selector(kind)(pool, 1, 0, 1, random.Random(s), cfg or SelectionConfig(kind=kind))
        out[first.id] = out.get(first.id, 0) + 1
    return out


def test_pareto_keeps_an_agent_that_alone_solves_some_inputs():
    from evoagent.evolve.pool import Pool

    solved = {"a": {"1", "2", "3", "4", "5", "6"}, "b": {"7", "8", "9"}, "c": {"1", "2"}, "d": set()}
    rewards = {k: {str(i): float(str(i) in v) for i in range(1, 11)} for k, v in solved.items()}
    pool = Pool([cand(k, len(v) / 10) for k, v in solved.items()], lambda: rewards)
    got = picks("pareto", pool)
    assert set(got) == {"a", "b"}  # c is dominated by a, d leads nowhere
    assert 0.5 < got["a"] / 300 < 0.8  # 6 of the 9 led inputs
    assert picks("dgm", pool).get("c", 0) > 0  # selection by score alone breeds the dominated too


def test_map_elites_draws_each_occupied_cells_elite_alike():
    from evoagent.evolve.pool import Pool
    from evoagent.spec.config import DescriptorConfig, SelectionConfig

    scores = {"small": 0.2, "small_best": 0.3, "large": 0.5, "large_best": 0.6, "unmeasured": 0.9}
    sizes = {"small": 1, "small_best": 1, "large": 3, "large_best": 3}
    pool = Pool([cand(k, v) for k, v in scores.items()], measure=lambda name, ids: sizes)
    cfg = SelectionConfig(kind="map_elites", descriptors=(DescriptorConfig(name="nodes", bins=(2,)),))
    got = picks("map_elites", pool, cfg)
    assert set(got) == {"small_best", "large_best"}
    assert 0.35 < got["small_best"] / 300 < 0.65


def test_pareto_and_map_elites_run_a_search_from_the_archive(tmp_path):
    grid = ("  selection: {kind: map_elites, descriptors: [{name: nodes, bins: [2]}, "
            "{name: llm_calls_per_input, bins: [1.5]}, {name: tokens_per_input, bins: [20]}]}\n")
    for kind, extra in (("pareto", "  selection: {kind: pareto}\n"), ("map_elites", grid)):
        text = SPEC.replace("generations: 1", "generations: 2").replace(
            "operators: [{name: 'respell:respell'}]", "operators: [{name: insert_tool}, {name: add_node}]")
        (tmp_path / kind).mkdir()
        (tmp_path / kind / "task.yaml").write_text(text.replace("graphs:", "  tools: [calculator]\ngraphs:", 1)
                                                   + extra)
        spec = load_spec(tmp_path / kind / "task.yaml").model_copy(update={"output": str(tmp_path / kind)})
        check_spec(spec)
        policy = ScriptedBackend()
        with Archive(spec.run_dir) as archive:
            result = asyncio.run(Search(spec, policy, policy, archive).run())
        assert result.generations == 2
        with Archive(spec.run_dir, write=False) as a:
            assert len(a.agents(status="ok")) > 2  # children were bred from the strategy's parents
        page = write_report(spec.run_dir).read_text()
        assert ("<table id='grid'>" in page) == (kind == "map_elites")
    cells = page[page.index("<table id='grid'>"):].split("</table>")[0]
    assert "<th>nodes</th><th>llm_calls_per_input</th><th>tokens_per_input</th>" in cells
    assert cells.count("<tr>") >= 2  # the header and at least one occupied cell
