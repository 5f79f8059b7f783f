"""task.yaml errors must name the field (and the file and line) so a user can fix them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoagent import runner
from evoagent.check import check_spec
from evoagent.cli import app
from evoagent.errors import SpecError
from evoagent.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "arithmetic" / "task.yaml"

GOOD = """
name: t
task:
  description: add numbers
  dataset: {kind: reasoning_gym, name: basic_arithmetic, size: 40}
  splits: {train: 4, val: 4, test: 4}
graphs: [g.yaml]
"""
GRAPH = """
entry: a
exit: a
nodes: [{kind: llm, id: a}]
"""


def write(tmp_path: Path, spec: str, graph: str = GRAPH) -> Path:
    (tmp_path / "g.yaml").write_text(graph)
    p = tmp_path / "task.yaml"
    p.write_text(spec)
    return p


def test_the_example_spec_is_valid():
    spec = load_spec(EXAMPLE)
    check_spec(spec)
    assert spec.resolve(spec.graphs[0]).is_file()
    assert spec.rl.enabled and spec.task.tools == ("calculator",)


def test_unknown_key_suggests_the_right_one(tmp_path):
    bad = GOOD.replace("splits:", "splitz:")
    with pytest.raises(SpecError, match=r"task\.splitz: unknown key; did you mean 'splits'"):
        load_spec(write(tmp_path, bad))


def test_wrong_type_names_the_field_path(tmp_path):
    bad = GOOD + "evolve: {generations: many}\n"
    with pytest.raises(SpecError, match=r"evolve\.generations"):
        load_spec(write(tmp_path, bad))


def test_yaml_syntax_error_names_the_line(tmp_path):
    with pytest.raises(SpecError, match=r"task\.yaml:line \d+: YAML syntax error"):
        load_spec(write(tmp_path, GOOD + "graphs: [unclosed\n"))


def test_missing_required_field(tmp_path):
    with pytest.raises(SpecError, match=r"task\.description: required field is missing"):
        load_spec(write(tmp_path, GOOD.replace("  description: add numbers\n", "")))


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("evolve: {operators: [{name: no_such_op}]}\n", r"evolve\.operators\[0\]: .*unknown operator 'no_such_op'"),
        ("evolve: {operators: [{name: 'nomodule:fn'}]}\n", r"evolve\.operators\[0\]: .*cannot import"),
        ("policy: {kind: gpt9}\n", r"policy\.kind: unknown backend 'gpt9'"),
        ("evolve: {selection: {kind: roulette}}\n", r"evolve\.selection\.kind: unknown selector"),
    ],
)
def test_unknown_names_fail_before_any_model_loads(tmp_path, extra, field, monkeypatch):
    task = write(tmp_path, GOOD + extra)
    with pytest.raises(SpecError, match=field):
        check_spec(load_spec(task))
    monkeypatch.setattr(runner, "make_backends", lambda *a: pytest.fail("a model was loaded"))
    res = CliRunner().invoke(app, ["run", str(task), "--output", str(tmp_path / "pop")])
    assert res.exit_code == 2 and re.search(field, " ".join(res.output.split())), res.output


def test_unknown_reward_and_tool(tmp_path):
    spec = load_spec(write(tmp_path, GOOD.replace("  splits:", "  reward: {kind: vibes}\n  splits:")))
    with pytest.raises(SpecError, match=r"task\.reward\.kind: unknown reward 'vibes'"):
        check_spec(spec)
    spec = load_spec(write(tmp_path, GOOD.replace("  splits:", "  tools: [hammer]\n  splits:")))
    with pytest.raises(SpecError, match=r"task\.tools\[0\]: .*hammer"):
        check_spec(spec)


def test_cyclic_seed_graph_is_named(tmp_path):
    cyclic = """
entry: a
exit: b
nodes: [{kind: llm, id: a}, {kind: llm, id: b, template: "{a}"}, {kind: llm, id: c}]
edges: [{src: a, dst: b}, {src: b, dst: c}, {src: c, dst: b}]
"""
    spec = load_spec(write(tmp_path, GOOD, cyclic))
    with pytest.raises(SpecError, match=r"graphs\[0\] \(g\.yaml\): graph has a cycle"):
        check_spec(spec)


def test_bad_rl_algorithm_lists_known(tmp_path):
    with pytest.raises(SpecError, match=r"rl\.algorithm.*grpo"):
        load_spec(write(tmp_path, GOOD + "rl: {algorithm: ppo2}\n"))


def test_not_a_mapping(tmp_path):
    with pytest.raises(SpecError, match="mapping"):
        load_spec(write(tmp_path, "- just\n- a list\n"))


def test_rl_misconfiguration_fails_at_spec_time(tmp_path):
    no_train = GOOD.replace("train: 4", "train: 0") + "rl: {enabled: true}\n"
    with pytest.raises(SpecError, match=r"rl\.enabled: task\.splits\.train is 0"):
        check_spec(load_spec(write(tmp_path, no_train)))
    scripted = GOOD + "rl: {enabled: true}\npolicy: {kind: scripted}\n"
    with pytest.raises(SpecError, match=r"rl\.enabled: policy\.kind 'scripted' cannot be trained"):
        check_spec(load_spec(write(tmp_path, scripted)))


def test_only_a_backend_registered_as_trainable_passes_the_rl_check():
    from evoagent.llm.factory import backend_entry, known_backends

    assert {k for k in known_backends() if backend_entry(k).trainable} == {"hf", "openai", "vllm"}
    assert backend_entry("openai").train_check is not None  # only with local weights (test_bad_input)


def test_a_decaying_lr_schedule_must_cover_every_rl_step(tmp_path):
    spec = GOOD + (
        "evolve: {generations: 4}\n"
        "rl: {enabled: true, every: 1, steps: 2, lr_schedule: cosine, schedule_steps: 6}\n"
    )
    with pytest.raises(SpecError, match=r"rl\.schedule_steps: 6 but the run takes 8 RL steps"):
        check_spec(load_spec(write(tmp_path, spec)))
