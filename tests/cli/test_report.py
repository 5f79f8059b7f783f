"""``evoagent report`` on a small real run (tiny hf policy, RL phases), opened in a real browser:
Debian's chromium driven by playwright. Every section must render with the right number of
traces, nodes and rows; a screenshot is kept under the test's tmp dir."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoagent.archive import Archive
from evoagent.archive.views import ListFilter, curves, lineage_edges, list_agents, operator_stats
from evoagent.cli import app

ROOT = Path(__file__).resolve().parents[2]
SPEC = """
name: rep
seed: 4
task:
  description: Arithmetic such as "Calculate 95 - 21."; the answer is one number.
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 40,
            options: {{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}}}
  splits: {{train: 4, val: 5, test: 3}}
  tools: [calculator]
graphs: [{root}/graphs/direct.yaml, {root}/graphs/cot.yaml, {root}/graphs/critique_revise.yaml]
policy: {{kind: hf, model: {model}, dtype: float32, max_batch: 16}}
evolve:
  generations: 3
  children: 3
  operators: [{{name: insert_tool, weight: 2}}, {{name: param_search}}, {{name: add_node}}]
  cascade: {{minibatch: 2}}
rl: {{enabled: true, every: 1, steps: 2, group_size: 2, inputs_per_step: 2, lr: 1.0e-3,
      max_completion_tokens: 16, dynamic_sampling: false}}
"""
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def report(tmp_path_factory, tiny_model_dir) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("report")
    (tmp / "task.yaml").write_text(SPEC.format(root=ROOT, model=tiny_model_dir))
    cli = CliRunner()
    res = cli.invoke(app, ["run", str(tmp / "task.yaml"), "--output", str(tmp / "pop"), "--progress", "quiet"])
    assert res.exit_code == 0, res.output
    run_dir = tmp / "pop" / "rep"
    res = cli.invoke(app, ["report", str(run_dir)])
    assert res.exit_code == 0, res.output
    return run_dir, run_dir / "report.html"


def test_the_report_is_one_offline_file(report):
    _, html = report
    text = html.read_text()
    assert "<script src" not in text and "<link" not in text  # nothing is fetched when opened
    for section in ("curves", "lineage", "graphs", "instances", "operators", "rl"):
        assert f'id="section-{section}"' in text


@pytest.mark.skipif(BROWSER is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_every_section_renders_in_a_browser(report, tmp_path):
    from playwright.sync_api import sync_playwright

    run_dir, html = report
    with Archive(run_dir, write=False) as a:
        points = curves(a)
        islands = len({p.island for p in points})
        best = [r for r in list_agents(a, ListFilter(status="ok")) if r.stage == "full"][:5]
        graphs = {r.id: a.agent(r.id).graph for r in best}
        ops = operator_stats(a)
        edges = {(e.parent, e.child) for r in best for e in lineage_edges(a, r.id)}
        lineage_ops = {e.operator for r in best for e in lineage_edges(a, r.id)}
        val_inputs = {t.input_id for t in a.trajectories(best[0].id, "val")}
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=BROWSER, headless=True,
            args=["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-dev-shm-usage"],
        )
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto(html.resolve().as_uri())
        page.wait_for_selector("#rl .main-svg")
        traces = lambda div: page.evaluate(f"document.getElementById({div!r}).data.length")  # noqa: E731
        assert traces("curves") == 2 * islands  # best and median per island
        assert traces("lineage") == len(lineage_ops) + 1  # one trace per operator, plus the agents
        nodes = page.evaluate("document.getElementById('lineage').data.at(-1).x.length")
        assert nodes == len({n for e in edges for n in e} | set(graphs))
        for aid, g in graphs.items():
            drawn = page.evaluate(f"document.getElementById('graph-{aid}').data.at(-1).x.length")
            assert drawn == len(g.nodes)
        assert page.locator("#instances tbody tr").count() == len(val_inputs)
        assert page.locator("#instances thead th").count() == len(graphs) + 1
        assert page.locator("#operators tbody tr").count() == len(ops)
        assert traces("rl") >= 3  # reward, accuracy, loss per step
        rl_points = page.evaluate("document.getElementById('rl').data[0].x.length")
        assert rl_points == 4  # two phases of two steps
        assert page.locator("#schedule tr").count() == 1 + 5  # search, RL, search, RL, search
        assert page.locator(".js-plotly-plot").count() == 4 + len(graphs)
        shot = tmp_path / "report.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert shot.stat().st_size > 10_000


def test_an_exported_adapter_loads_with_plain_peft(report, tmp_path, tiny_model_dir):
    """The export is peft's own format: PeftModel.from_pretrained reads it, weights intact."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from evoagent.replay import adapter_weights, archived_agent

    run_dir, _ = report
    with Archive(run_dir, write=False) as a:
        best = [r for r in list_agents(a, ListFilter(status="ok")) if r.stage == "full"][0]
        agent = archived_agent(a, best.id)
    assert agent.weights_version == 2 and agent.checkpoint is not None
    res = CliRunner().invoke(app, ["archive", "export", str(run_dir), best.id, str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, str(tmp_path / "out" / "adapter"))
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    trained = adapter_weights(agent.checkpoint)
    assert len(loaded) == len(trained) > 0
    for key, value in trained.items():
        match = [v for k, v in loaded.items() if k.replace(".default", "") == key]
        assert match and torch.equal(match[0], value), key
