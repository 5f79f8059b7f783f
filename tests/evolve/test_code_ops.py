"""``rewrite_tool``: an agent whose own unit converter has one wrong factor gets it fixed by a
scripted mutator and scores higher; programs that do not compile or crash are archived as
invalid with the error; a graph without a tool of its own is told the operator does not apply;
``archive diff`` shows the code change as a unified diff."""

from __future__ import annotations

import asyncio
import html
import random
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoagent.archive import Archive
from evoagent.cli import app
from evoagent.errors import GraphError, MutationError
from evoagent.evolve.catalog import get_operator
from evoagent.evolve.code_ops import RewriteToolSettings
from evoagent.evolve.hooks import NullReporter
from evoagent.evolve.loop import Search
from evoagent.evolve.operators import Feedback, MutationContext, TraceStep
from evoagent.graph import load_graph
from evoagent.graph.diff import graph_diff
from evoagent.graph.model import Edge, LLMNode, ToolNode
from evoagent.graph.validate import validate
from evoagent.llm.scripted import ScriptedBackend
from evoagent.report import write_report
from evoagent.spec import load_spec
from evoagent.tools.sandbox import SandboxConfig

ROOT = Path(__file__).resolve().parents[2]
MODE = "bwrap" if shutil.which("bwrap") else "rlimits-only"
FACTORS = {"miles": 1609.344, "yards": 0.9144, "feet": 0.3048, "inches": 0.0254}
WRONG = """\
FACTORS = {"miles": 1609.344, "yards": 0.9144, "feet": 0.3, "inches": 0.0254}


def main(text):
    value, unit = text.split()
    return str(round(float(value) * FACTORS[unit], 3))
"""
FIXED = WRONG.replace('"feet": 0.3,', '"feet": 0.3048,')
DATA = f"""\
FACTORS = {FACTORS!r}


def lengths(seed, size):
    import random

    rng = random.Random(seed)
    units = sorted(FACTORS)
    out = []
    for i in range(size):
        value, unit = rng.randint(1, 500), units[i % len(units)]
        out.append({{"id": f"len-{{i}}", "input": f"{{value}} {{unit}}",
                     "answer": str(round(value * FACTORS[unit], 3))}})
    return out
"""
GRAPH = """\
name: converter
entry: convert
exit: answer
nodes:
  - kind: tool
    id: convert
    tool: python
    template: "{input}"
    source: |
%s
  - {kind: llm, id: answer, template: "How many metres is {input}?\\n\\nconverter result: {convert}"}
edges: [{src: convert, dst: answer}]
""" % "\n".join("      " + line if line else "" for line in WRONG.splitlines())
SPEC = f"""\
name: units
seed: 3
task:
  description: Convert a length in miles, yards, feet or inches to metres.
  dataset: {{kind: python, ref: "units_data:lengths", size: 80}}
  splits: {{train: 8, val: 16, test: 16}}
graphs: [graph.yaml]
policy: {{kind: scripted}}
sandbox: {{mode: {MODE}}}
evolve:
  generations: 1
  children: 2
  operators: [{{name: rewrite_tool, params: {{insert: 0.0}}}}]
  cascade: {{minibatch: 4}}
"""


def read_converter(request) -> str:
    """The policy: the answer node repeats the converter's result."""
    text = request.messages[-1]["content"]
    return text.rsplit("converter result:", 1)[-1].strip()


def fixing_mutator(reply: str) -> ScriptedBackend:
    return ScriptedBackend(handler=lambda request: f"The factor is off.\n```python\n{reply}```")


@pytest.fixture
def task(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "units_data.py").write_text(DATA)
    (tmp_path / "graph.yaml").write_text(GRAPH)
    (tmp_path / "task.yaml").write_text(SPEC)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "task.yaml"


def run(task: Path, mutator: ScriptedBackend):
    spec = load_spec(task).model_copy(update={"output": str(task.parent / "pop")})
    policy = ScriptedBackend(handler=read_converter)
    with Archive(spec.run_dir) as archive:
        result = asyncio.run(Search(spec, policy, mutator, archive, NullReporter()).run())
    return spec, result


def test_a_wrong_factor_is_fixed_and_the_score_rises(task):
    spec, result = run(task, fixing_mutator(FIXED))
    with Archive(spec.run_dir, write=False) as a:
        (seed,) = a.agents(operator="seed")
        children = a.agents(operator="rewrite_tool")
        wrong = [t.input for t in a.trajectories(seed.id, "val", 0) if t.reward == 0.0]
        assert wrong and all(w.endswith(" feet") for w in wrong)  # only the wrong factor fails
        assert result.best_val == 1.0 and result.best_id in {c.id for c in children}
        child = a.agent(result.best_id).graph
    assert child.node("convert").source == FIXED and child.id != seed.graph.id
    out = CliRunner().invoke(app, ["archive", "diff", str(spec.run_dir), seed.id, result.best_id])
    assert out.exit_code == 0, out.output
    shown = " ".join(out.output.split())  # the terminal wraps long lines
    assert '-FACTORS = {"miles": 1609.344, "yards": 0.9144, "feet": 0.3, "inches": 0.0254}' in shown
    assert '+FACTORS = {"miles": 1609.344, "yards": 0.9144, "feet": 0.3048, "inches": 0.0254}' in shown
    page = write_report(spec.run_dir).read_text()
    assert 'id="section-code"' in page and "+FACTORS = {&quot;miles&quot;" in page
    assert "&quot;feet&quot;: 0.3048" in page


@pytest.mark.parametrize(("reply", "reason"), [
    ("def main(text)\n    return text\n", "source does not compile: expected ':'"),
    ("def helper(text):\n    return text\n", "source defines no main(text) function"),
    ("async def main(text):\n    return text\n", "source defines no main(text) function (a plain def"),
    ("def main(text):\n    raise ValueError('no such unit')\n", "fails in the sandbox on an input the tool was given"),
])
def test_a_program_that_does_not_compile_or_crashes_is_archived_invalid_with_the_error(task, reply, reason):
    spec, result = run(task, fixing_mutator(reply))
    with Archive(spec.run_dir, write=False) as a:
        children = a.agents(operator="rewrite_tool")
        assert children and all(c.status == "invalid" for c in children)
        assert all(reason in (c.reason or "") for c in children)
        (seed,) = a.agents(operator="seed")
        assert result.best_id == seed.id and result.best_val < 1.0  # the run went on with the seed
    if "sandbox" in reason:
        assert "ValueError: no such unit" in children[0].reason
    page = write_report(spec.run_dir).read_text()
    assert "id='code-invalid'" in page and html.escape(reason) in page


def context(mutator: ScriptedBackend, failures=(), insert: float = 0.0) -> MutationContext:
    return MutationContext(llm=mutator, rng=random.Random(0), task="convert lengths", failures=tuple(failures),
                           settings=RewriteToolSettings(insert=insert), sandbox=SandboxConfig(mode=MODE))


def test_a_graph_without_a_tool_of_its_own_is_told_it_does_not_apply():
    direct = load_graph(ROOT / "graphs" / "direct.yaml")
    with pytest.raises(MutationError, match="has no python tool of its own .* so it does not apply"):
        asyncio.run(get_operator("rewrite_tool").apply([direct], context(fixing_mutator(FIXED))))


def test_the_mutator_sees_what_the_tool_got_and_returned_and_can_insert_a_new_tool(task):
    graph = load_graph(task.parent / "graph.yaml")
    failure = Feedback("12 feet", "3.6", "3.658", 0.0, None, (
        TraceStep("convert", "tool", "python(12 feet)", "3.6"),
        TraceStep("answer", "llm", "How many metres is 12 feet?", "3.6"),
    ))
    seen: list[str] = []
    mutator = ScriptedBackend(handler=lambda r: seen.append(r.messages[-1]["content"]) or f"```python\n{FIXED}```")
    child = asyncio.run(get_operator("rewrite_tool").apply([graph], context(mutator, [failure])))
    assert "the tool got: 12 feet\n   the tool returned: 3.6" in seen[0] and '"feet": 0.3,' in seen[0]
    assert "expected: 3.658" in seen[0]
    change = next(c for c in graph_diff(graph, child).changes if c.field == "source")
    assert '+FACTORS = {"miles": 1609.344, "yards": 0.9144, "feet": 0.3048' in change.render()

    # a node no tool of the agent feeds yet (a checker after the answer) may get a new tool
    checked = graph.model_copy(update={
        "nodes": (*graph.nodes, LLMNode(id="check", template="Is {answer} right for {input}?")),
        "edges": (*graph.edges, Edge(src="answer", dst="check")), "exit": "check"})
    helper = "def main(text):\n    return text.upper()\n"
    grown = asyncio.run(get_operator("rewrite_tool").apply(
        [checked], context(ScriptedBackend(handler=lambda r: helper), [failure], insert=1.0)))
    added = [n for n in grown.nodes if n.id not in {m.id for m in checked.nodes}]
    assert len(added) == 1 and isinstance(added[0], ToolNode) and added[0].source == helper
    assert "tool result: {" + added[0].id + "}" in grown.node("check").template
    validate(grown, {"python"})


def test_a_source_on_a_tool_that_is_not_python_is_refused_by_name():
    with pytest.raises(GraphError, match="node 'calc': source is a python program; tool must be 'python'"):
        validate(load_graph(ROOT / "graphs" / "direct.yaml").model_copy(update={"nodes": (
            ToolNode(id="calc", tool="calculator", template="{input}", source="def main(t):\n  return t\n"),
        ), "entry": "calc", "exit": "calc", "edges": ()}), {"calculator"})


@pytest.mark.slow
def test_the_embedded_model_runs_the_operator_end_to_end(task):
    """The 135M as mutator: whatever it writes, each child is archived, valid with a new
    program or invalid with the operator's reason, and the run finishes."""
    from evoagent.llm.hf import HFBackend
    from evoagent.spec.config import BackendConfig

    mutator = HFBackend(BackendConfig(max_batch=4))
    spec, result = run(task, mutator)
    with Archive(spec.run_dir, write=False) as a:
        children = a.agents(operator="rewrite_tool")
        assert len(children) == 2 and result.best_val >= a.score(a.agents(operator="seed")[0].id, "val", 0)
        for c in children:
            if c.status == "ok":
                assert c.graph.node("convert").source != WRONG
            else:
                assert c.reason and "rewrite_tool" in c.reason
    assert mutator.usage.calls >= 2
