"""Built-in operators change what they promise and return valid graphs; plug-ins register."""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

import pytest

from evoagent.errors import MutationError, SpecError
from evoagent.evolve.catalog import get_operator, known_operators
from evoagent.evolve.operators import Feedback, MutationContext, TraceStep
from evoagent.evolve.param_search import space
from evoagent.evolve.pool import Candidate, Pool
from evoagent.evolve.selection import get_selector
from evoagent.execute.executor import ExecContext, execute
from evoagent.graph import LLMNode, ToolNode, load_graph, validate
from evoagent.llm.scripted import ScriptedBackend
from evoagent.spec.config import SelectionConfig
from evoagent.tasks.datasets import Example
from evoagent.tools import ToolContext, known_tools

ROOT = Path(__file__).resolve().parents[2]
DIRECT = load_graph(ROOT / "graphs" / "direct.yaml")
COT = load_graph(ROOT / "graphs" / "cot.yaml")
CRITIQUE = load_graph(ROOT / "graphs" / "critique_revise.yaml")
SC = load_graph(ROOT / "graphs" / "self_consistency.yaml")


def mctx(reply: str = "Compute carefully and reply with the number only.", **kw) -> MutationContext:
    kw.setdefault("tools", ("calculator",))
    return MutationContext(llm=ScriptedBackend(handler=lambda r: reply), rng=random.Random(0),
                           task="arithmetic", **kw)


def apply(name, parents, ctx):
    child = asyncio.run(get_operator(name).apply(parents, ctx))
    return validate(child, known_tools())


def test_builtins_are_registered():
    assert {"reflective_rewrite", "bootstrap_demos", "insert_tool", "delegate_to_tool", "add_node",
            "remove_node", "crossover", "param_search"} <= set(known_operators())


def test_insert_tool_feeds_the_tool_result_to_an_llm_node():
    child = apply("insert_tool", [DIRECT], mctx())
    tool = next(n for n in child.nodes if isinstance(n, ToolNode))
    assert tool.tool == "calculator" and child.entry == tool.id
    assert "{" + tool.id + "}" in child.node("answer").template
    with pytest.raises(MutationError, match="already sees"):
        apply("insert_tool", [child], mctx())
    with pytest.raises(MutationError, match="lists no tools"):
        apply("insert_tool", [DIRECT], mctx(tools=()))


def _run(graph, reply: str, question: str = "Ana has 17 pens and buys 25 more. How many?"):
    backend = ScriptedBackend(handler=lambda r: reply)
    ctx = ExecContext(backend, ToolContext(), seed=0)
    return asyncio.run(execute(graph, Example("q", question, "42"), ctx)), backend


def test_delegate_to_tool_makes_the_model_write_the_expression_and_the_tool_answer():
    child = apply("delegate_to_tool", [DIRECT], mctx())
    assert child.exit == "calculator"
    writer = child.node("answer")
    assert "calculator" in writer.system and "12 * (3 + 4)" in writer.system
    traj, backend = _run(child, "17 + 25")
    assert traj.output == "42"
    assert backend.requests[0].messages[-1]["content"].startswith("Ana has 17 pens")
    with pytest.raises(MutationError, match="already feeds a tool"):
        apply("delegate_to_tool", [child], mctx())


def test_delegate_to_tool_mid_graph_sends_the_tool_result_to_the_consumers():
    for seed in range(20):  # the target node is a seeded draw: take the first mid-graph one
        ctx = mctx()
        ctx = MutationContext(llm=ctx.llm, rng=random.Random(seed), task="t", tools=("calculator",))
        child = apply("delegate_to_tool", [CRITIQUE], ctx)
        writer = next(e.src for e in child.edges if e.dst == "calculator")
        if writer == "draft":
            break
    consumers = {e.dst for e in child.edges if e.src == "calculator"}
    assert writer != child.exit and consumers
    for c in consumers:
        assert "{calculator}" in child.node(c).template and "{" + writer + "}" not in child.node(c).template
    traj, _ = _run(child, "17 + 25")
    shown = [s.messages[-1]["content"] for s in traj.llm_steps if s.node in consumers]
    assert shown and all("42" in m for m in shown)


def test_reflective_rewrite_uses_the_mutators_words_and_shows_it_failures():
    fb = Feedback(input="Calculate 2 + 2.", output="5", expected="4", reward=0.0, error=None)
    ctx = mctx("New instructions: Add the numbers exactly.", failures=(fb,))
    child = apply("reflective_rewrite", [DIRECT], ctx)
    assert child.node("answer").system == "Add the numbers exactly."
    assert child.node("answer").template == DIRECT.node("answer").template
    shown = ctx.llm.requests[0].messages[0]["content"]
    assert "Calculate 2 + 2." in shown and "Correct answer: 4" in shown and "arithmetic" in shown
    with pytest.raises(MutationError, match="no new instruction"):
        apply("reflective_rewrite", [DIRECT], mctx("   "))


def test_reflective_rewrite_reads_the_trace_node_by_node_and_the_rewards_feedback():
    steps = (TraceStep("reason", "llm", "Q: Tom has 3 boxes of 12 eggs.", "3 + 12 = 15"),
             TraceStep("calc", "tool", "calculator(3 + 12)", "15"),
             TraceStep("answer", "llm", "Q: Tom has 3 boxes of 12 eggs.\n15", "15"))
    fb = Feedback("Tom has 3 boxes of 12 eggs.", "15", "36", 0.0, None, steps,
                  feedback="boxes of equal size call for multiplication")
    ctx = mctx("INSTRUCTIONS:\nMultiply when items come in boxes.\nTEMPLATE:\nSAME", failures=(fb,))
    apply("reflective_rewrite", [COT], ctx)
    shown = ctx.llm.requests[0].messages[0]["content"]
    for line in ("[reason] replied: 3 + 12 = 15", "[calc] called calculator(3 + 12) -> 15",
                 "[answer] was shown: Q: Tom has 3 boxes of 12 eggs. 15",
                 "Feedback: boxes of equal size call for multiplication"):
        assert line in shown


@pytest.mark.parametrize(("template", "kept"), [
    ("Question: {input}\nThink step by step, then give the number.", True),
    ("Think about it.", False),  # drops {input}: the data flow would break
    ("{input} {nowhere}", False),  # a placeholder no upstream node fills
    ("{input", False),  # malformed
])
def test_reflective_rewrite_may_rewrite_the_template_but_never_the_data_flow(template, kept):
    reply = f"INSTRUCTIONS:\nBe exact.\nTEMPLATE:\n{template}"
    child = apply("reflective_rewrite", [DIRECT], mctx(reply))
    node = child.node("answer")
    assert node.system == "Be exact."
    assert node.template == (template if kept else DIRECT.node("answer").template)


def test_bootstrap_demos_needs_and_uses_successes():
    with pytest.raises(MutationError, match="no successful execution"):
        apply("bootstrap_demos", [DIRECT], mctx())
    ok = Feedback("Calculate 1 + 2.", "3", "3", 1.0, None,
                  (TraceStep("answer", "llm", "Calculate 1 + 2.", "3"),
                   TraceStep("calc", "tool", "calculator(1 + 2)", "3")))
    child = apply("bootstrap_demos", [DIRECT], mctx(successes=(ok,)))
    (demo,) = child.node("answer").demos
    assert (demo.input, demo.output) == ("Calculate 1 + 2.", "3")


def test_add_node_appends_a_revise_step_and_remove_node_undoes_it():
    child = apply("add_node", [DIRECT], mctx())
    assert child.exit != DIRECT.exit and len(child.nodes) == 2
    assert "{answer}" in child.node(child.exit).template
    back = apply("remove_node", [child], mctx())
    assert len(back.nodes) == 1 and back.exit == "answer"
    assert back.id == DIRECT.id


def test_remove_node_rewires_templates():
    child = apply("remove_node", [CRITIQUE], mctx())
    assert len(child.nodes) == 2


def test_crossover_mixes_shared_nodes():
    other = COT.replace_node(COT.node("reason").model_copy(update={"system": "Be exact."}))
    child = apply("crossover", [COT, other], mctx())
    assert child.id not in (COT.id,) and child.node("reason").system == "Be exact."
    with pytest.raises(MutationError, match="share no node"):
        apply("crossover", [COT, DIRECT], mctx())


def test_param_search_proposes_within_the_space_and_learns_from_history():
    dists = space(SC)
    assert "reason.samples" in dists and "reason.temperature" in dists
    hist = tuple(
        (SC.replace_node(SC.node("reason").model_copy(update={"temperature": t})), s)
        for t, s in [(0.1, 0.9), (0.2, 0.8), (1.0, 0.1), (1.1, 0.0), (0.15, 0.85)]
    )
    child = apply("param_search", [SC], mctx(history=lambda: hist))
    node = child.node("reason")
    assert 0.0 <= node.temperature <= 1.2 and node.samples in (1, 3, 5)
    again = apply("param_search", [SC], mctx(history=lambda: hist))
    assert again.id == child.id  # seeded: the same context proposes the same child


def test_user_operator_by_module_ref(tmp_path, monkeypatch):
    (tmp_path / "my_ops.py").write_text(
        "import evoagent\n"
        "@evoagent.mutation('shout_test')\n"
        "def shout(parents, ctx):\n"
        "    g = parents[0]\n"
        "    n = g.node(g.exit)\n"
        "    return g.replace_node(n.model_copy(update={'system': 'SHOUT'}))\n"
        "def plain(parents, ctx):\n"
        "    return parents[0]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    op = get_operator("my_ops:shout")
    assert op.name == "shout_test"
    child = asyncio.run(op.apply([DIRECT], mctx()))
    assert isinstance(child.node("answer"), LLMNode) and child.node("answer").system == "SHOUT"
    assert get_operator("my_ops:plain").parents == 1
    sys.modules.pop("my_ops", None)


def test_unknown_operator_lists_known():
    with pytest.raises(SpecError, match=r"unknown operator 'nope'; known: .*insert_tool"):
        get_operator("nope")


def cand(i, score, island=0, children=0):
    return Candidate(f"agent{i}", score, island, children, 0)


def test_islands_choose_within_the_island_and_migrate_the_best():
    cands = [cand(0, 0.9, 0), cand(1, 0.1, 1), cand(2, 0.2, 1)]
    pool = Pool(cands)
    cfg = SelectionConfig(islands=2, temperature=0.05, migrate_every=3)
    parents, island = get_selector("islands")(pool, 1, 1, 1, random.Random(0), cfg)
    assert island == 1 and parents[0].island == 1
    parents, _ = get_selector("islands")(pool, 1, 1, 3, random.Random(0), cfg)  # migration gen
    assert parents[0].id == cands[0].id
    two, _ = get_selector("islands")(pool, 2, 0, 1, random.Random(0), cfg)
    assert len({p.id for p in two}) == 2


def test_dgm_prefers_good_agents_with_few_children():
    cands = [cand(0, 0.8, children=20), cand(1, 0.8, children=0), cand(2, 0.0)]
    picks = [get_selector("dgm")(Pool(cands), 1, 0, 1, random.Random(s), SelectionConfig())[0][0].id
             for s in range(200)]
    assert picks.count(cands[1].id) > picks.count(cands[0].id) > picks.count(cands[2].id)


def test_a_plugin_cannot_take_a_builtin_operators_name():
    import evoagent

    with pytest.raises(SpecError, match="operator 'insert_tool' is already registered"):
        evoagent.mutation("insert_tool")(lambda parents, ctx: parents[0])
    assert get_operator("insert_tool").fn.__module__ == "evoagent.evolve.structure_ops"


def _success(a: int, b: int) -> Feedback:
    q = f"Calculate {a} + {b}."
    return Feedback(q, str(a + b), str(a + b), 1.0, None, (TraceStep("answer", "llm", q, str(a + b)),))


def test_bootstrap_demos_swaps_a_demo_once_the_node_is_full_and_says_when_nothing_is_new():
    wins = tuple(_success(a, 1) for a in range(5))
    full = apply("bootstrap_demos", [DIRECT], mctx(successes=wins[:2], max_demos=2))
    assert len(full.node("answer").demos) == 2
    swapped = apply("bootstrap_demos", [full], mctx(successes=wins, max_demos=2))
    before, after = full.node("answer").demos, swapped.node("answer").demos
    assert len(after) == 2 and len(set(before) & set(after)) == 1  # one kept, one fresh
    with pytest.raises(MutationError, match="every successful execution is already a demo"):
        apply("bootstrap_demos", [full], mctx(successes=wins[:2], max_demos=2))


@pytest.mark.parametrize("reply", [
    "INSTRUCTIONS: Be exact.\nTEMPLATE: Solve: {input}",
    "**Instructions:**\nBe exact.\n\n**Template:**\nSolve: {input}",
    "## INSTRUCTIONS\nBe exact.\n## TEMPLATE\nSolve: {input}",
])
def test_reflective_rewrite_reads_the_markers_small_models_write(reply):
    from evoagent.evolve.prompt_ops import parse_rewrite

    assert parse_rewrite(reply) == ("Be exact.", "Solve: {input}")
    assert parse_rewrite(reply, truncated=True) == ("Be exact.", None)
