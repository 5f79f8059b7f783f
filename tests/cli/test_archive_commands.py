"""``evoagent archive ...`` on a real (scripted-policy) run: filters and JSON for scripts,
show/diff/lineage say what a person needs, export runs on its own, replay prints the steps."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoagent.archive import Archive
from evoagent.check import check_spec
from evoagent.cli import app
from evoagent.evolve.loop import Search
from evoagent.llm.scripted import ScriptedBackend
from evoagent.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = f"""
name: cmds
seed: 2
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
  operators: [{{name: insert_tool, weight: 3}}, {{name: reflective_rewrite}}, {{name: param_search}}]
  cascade: {{minibatch: 2}}
"""


def calculator_reader(request) -> str:
    import re

    m = re.search(r"calculator result: (-?[\d.]+)", request.messages[-1]["content"])
    if m:
        return f"The answer is {m.group(1)}"
    if "improve the instructions" in request.messages[-1]["content"]:
        return "Read the calculator result and answer with that number."
    return "I think 7"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("cmds")
    (tmp / "task.yaml").write_text(SPEC)
    spec = load_spec(tmp / "task.yaml").model_copy(update={"output": str(tmp / "pop")})
    check_spec(spec)
    policy = ScriptedBackend(handler=calculator_reader)
    with Archive(spec.run_dir) as archive:
        result = asyncio.run(Search(spec, policy, policy, archive).run())
    return spec.run_dir, result.best_id


def cli(*args: str) -> str:
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def test_list_filters_sorts_and_speaks_json(run):
    run_dir, best = run
    rows = json.loads(cli("archive", "list", str(run_dir), "--json"))
    assert rows[0]["id"] == best and rows[0]["score"] == 1.0 and rows[0]["stage"] == "full"
    scores = [r["score"] for r in rows if r["score"] is not None]
    assert scores == sorted(scores, reverse=True)
    top = json.loads(cli("archive", "list", str(run_dir), "--json", "--top", "2"))
    assert [r["id"] for r in top] == [r["id"] for r in rows[:2]]
    gen2 = json.loads(cli("archive", "list", str(run_dir), "--json", "--generation", "2"))
    assert gen2 and {r["generation"] for r in gen2} == {2}
    island = json.loads(cli("archive", "list", str(run_dir), "--json", "--island", "1"))
    assert island and {r["island"] for r in island} == {1}
    by_id = json.loads(cli("archive", "list", str(run_dir), "--json", "--sort", "id"))
    assert [r["id"] for r in by_id] == sorted(r["id"] for r in rows)
    assert best in cli("archive", "list", str(run_dir))  # the table shows whole ids


def test_show_gives_provenance_scores_cost_and_graph(run):
    run_dir, best = run
    d = json.loads(cli("archive", "show", str(run_dir), best[:6], "--json"))
    assert d["id"] == best and d["parents"] and d["operator"] in ("insert_tool", "reflective_rewrite",
                                                                  "param_search")
    assert {(e["split"], e["stage"]) for e in d["evaluations"]} >= {("val", "minibatch"), ("val", "full")}
    assert d["cost"]["tokens"] > 0 and d["graph"]["nodes"]
    text = " ".join(cli("archive", "show", str(run_dir), best).split())
    assert best in text and "cost:" in text and "calculator" in text


def test_diff_names_what_the_operator_changed(run):
    run_dir, best = run
    d = json.loads(cli("archive", "show", str(run_dir), best, "--json"))
    parent = d["parents"][0]
    j = json.loads(cli("archive", "diff", str(run_dir), parent, best, "--json"))
    assert j["a"] == parent and j["b"] == best
    assert j["nodes_added"] or j["changes"] or j["edges_added"]
    text = cli("archive", "diff", str(run_dir), parent, best)
    if d["operator"] == "insert_tool":
        assert "+ node calculator" in text and "+ edge" in text and "--- answer.template (a)" in text


def test_lineage_walks_back_to_the_seeds_with_operators_and_score_changes(run):
    run_dir, best = run
    j = json.loads(cli("archive", "lineage", str(run_dir), best, "--json"))
    with Archive(run_dir, write=False) as a:
        seeds = {r.id for r in a.agents() if r.operator == "seed"}
    assert j["id"] == best and j["edges"][0]["child"] == best
    assert {e["parent"] for e in j["edges"]} & seeds
    tree = cli("archive", "lineage", str(run_dir), best)
    assert best in tree and "--[" in tree and "(+" in tree


def test_export_writes_a_folder_that_runs_without_the_archive(run, tmp_path):
    run_dir, best = run
    out = tmp_path / "agent"
    text = cli("archive", "export", str(run_dir), best, str(out))
    assert "run.py" in text
    assert {p.name for p in out.iterdir()} == {"graph.yaml", "agent.json", "run.py"}  # v0: no adapter
    replayed = json.loads(cli("archive", "replay", str(run_dir), best, "--input", "Calculate 12 + 30.", "--json"))
    away = run_dir.with_name(run_dir.name + "-away")
    run_dir.rename(away)  # the archive is gone while the exported agent runs
    try:
        proc = subprocess.run([sys.executable, str(out / "run.py"), "Calculate 12 + 30."],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
    finally:
        away.rename(run_dir)
    assert proc.returncode == 0, proc.stderr
    assert replayed["output"] and proc.stdout.strip() == replayed["output"].strip()  # the same agent, the same answer


def test_replay_prints_each_step(run):
    run_dir, best = run
    text = cli("archive", "replay", str(run_dir), best, "--input", "Calculate 12 + 30.")
    assert "tool calculator" in text and "-> '42'" in text and "output:" in text
    traj = json.loads(cli("archive", "replay", str(run_dir), best, "--input", "Calculate 1 + 2.", "--json"))
    assert any(s["kind"] == "tool" for s in traj["steps"]) and traj["output"]
