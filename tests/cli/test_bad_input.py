"""A corpus of malformed task specs, graph files and command lines, each with the error a user
must see: one clear message naming what is wrong, exit code 2, no traceback, and no model load
(every spec here uses the scripted policy or fails before a backend is built)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoagent.archive import Archive
from evoagent.cli import app

GOOD = """\
name: bad
task:
  description: add numbers
  dataset: {kind: reasoning_gym, name: basic_arithmetic, size: 30}
  splits: {train: 4, val: 4, test: 4}
  tools: [calculator]
graphs: [g.yaml]
policy: {kind: scripted}
"""
GRAPH = """\
entry: a
exit: b
nodes:
  - {kind: llm, id: a, template: "{input}"}
  - {kind: llm, id: b, template: "{a}"}
edges: [{src: a, dst: b}]
"""


@dataclass
class Case:
    id: str
    expect: str  # regex searched in the whitespace-normalised output
    spec: str | bytes | None = GOOD
    graph: str = GRAPH
    args: list[str] = field(default_factory=lambda: ["run", "task.yaml"])
    files: dict[str, str] = field(default_factory=dict)


def spec_with(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new)


def graph_with(old: str, new: str) -> str:
    assert old in GRAPH, old
    return GRAPH.replace(old, new)


BOMB = "    a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(  # billion laughs, 72 aliases
    f"    {c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi")
)

CASES = [
    # -- YAML itself
    Case("yaml-syntax", r"task\.yaml:line \d+: YAML syntax error: expected ',' or '\]'", GOOD + "graphs: [unclosed\n"),
    Case("yaml-tab-indent", r"task\.yaml:line \d+: YAML syntax error", GOOD + "evolve:\n\tgenerations: 2\n"),
    Case("yaml-top-level-list", r"top level must be a mapping", "- name: x\n"),
    Case("yaml-empty-file", r"top level must be a mapping", ""),
    Case("yaml-python-tag", r"could not determine a constructor.*only plain YAML is allowed",
         GOOD + "seed: !!python/object/apply:os.system ['echo pwned']\n"),
    Case("yaml-alias-bomb", r"expands to [\d,]+ YAML nodes \(limit 100,000\); refusing",
         "laughs:\n" + BOMB + spec_with("size: 30}", "size: 30, options: {bomb: *i}}")),
    Case("yaml-50mb", r"larger than the 1000000-byte limit", GOOD + "#" + "x" * 50_000_000 + "\n"),
    Case("yaml-not-utf8", r"not UTF-8 \(byte \d+", GOOD.encode() + b"# caf\xe9\n"),
    Case("yaml-duplicate-key", r"task\.yaml:line 10: duplicate key 'seed' \(first at line 9\)",
         GOOD + "seed: 1\nseed: 2\n"),
    # -- schema: types, keys, ranges
    Case("unknown-top-key", r"evolv: unknown key; did you mean 'evolve'", GOOD + "evolv: {}\n"),
    Case("unknown-nested-key", r"task\.splitz: unknown key; did you mean 'splits'",
         spec_with("splits:", "splitz:")),
    Case("wrong-type", r"evolve\.generations: .*integer", GOOD + "evolve: {generations: many}\n"),
    Case("negative-generations", r"evolve\.generations: .*greater than or equal to 0",
         GOOD + "evolve: {generations: -1}\n"),
    Case("zero-children-no-rl", r"evolve\.children: 0 searches no programs, and with rl\.enabled false",
         GOOD + "evolve: {children: 0}\n"),
    Case("zero-budget", r"evolve\.max_calls: .*greater than or equal to 1", GOOD + "evolve: {max_calls: 0}\n"),
    Case("negative-weight", r"evolve\.operators\.0\.weight: .*greater than 0",
         GOOD + "evolve: {operators: [{name: insert_tool, weight: -2}]}\n"),
    Case("group-size-one", r"rl\.group_size: .*greater than or equal to 2", GOOD + "rl: {group_size: 1}\n"),
    Case("missing-description", r"task\.description: required field is missing",
         spec_with("  description: add numbers\n", "")),
    Case("missing-graphs", r"graphs: required field is missing", spec_with("graphs: [g.yaml]\n", "")),
    Case("empty-graphs", r"graphs: .*at least 1", spec_with("graphs: [g.yaml]", "graphs: []")),
    Case("graph-twice", r"seed graphs are listed twice", spec_with("[g.yaml]", "[g.yaml, g.yaml]")),
    Case("bad-run-name", r"name: .*should match pattern", spec_with("name: bad", "name: 'my run/1'")),
    Case("reward-timeout-zero", r"task\.reward\.timeout_s: .*greater than 0",
         spec_with("  tools:", "  reward: {timeout_s: 0}\n  tools:")),
    Case("kl-without-reference", r"kl_beta > 0 needs the base model",
         GOOD + "rl: {kl_beta: 0.1, full_finetune: true}\n"),
    Case("bad-sandbox-mode", r"sandbox\.mode", GOOD + "sandbox: {mode: docker}\n"),
    # -- names that do not resolve: the error lists the known ones
    Case("unknown-operator", r"evolve\.operators\[0\]: unknown operator 'mutate_harder'; known: \[.*insert_tool",
         GOOD + "evolve: {operators: [{name: mutate_harder}]}\n"),
    Case("unknown-tool", r"task\.tools\[0\]: unknown tool 'abacus'; known tools: .*calculator",
         spec_with("tools: [calculator]", "tools: [abacus]")),
    Case("unknown-reward", r"task\.reward\.kind: unknown reward 'close_enough'; known: \[",
         spec_with("  tools:", "  reward: {kind: close_enough}\n  tools:")),
    Case("python-reward-without-ref", r"task\.reward\.ref: required for kind python",
         spec_with("  tools:", "  reward: {kind: python}\n  tools:")),
    Case("python-reward-missing-module", r"task\.reward\.ref: cannot import 'no_such_mod:score'",
         spec_with("  tools:", "  reward: {kind: python, ref: 'no_such_mod:score'}\n  tools:")),
    Case("operator-timeout-zero", r"evolve\.operator_timeout_s: .*greater than 0",
         GOOD + "evolve: {operator_timeout_s: 0}\n"),
    Case("unknown-extractor", r"task\.reward\.extract: unknown extractor 'middle_number'",
         spec_with("  tools:", "  reward: {extract: middle_number}\n  tools:")),
    Case("unknown-backend", r"policy\.kind: unknown backend 'gpt9'; known: \['hf', 'openai', 'scripted', 'vllm'\]",
         spec_with("{kind: scripted}", "{kind: gpt9}")),
    Case("unknown-dataset-kind", r"task\.dataset\.kind: unknown dataset 'csv'; known: \[",
         spec_with("kind: reasoning_gym, name: basic_arithmetic", "kind: csv")),
    Case("unknown-rg-generator", r"task\.dataset\.name: unknown reasoning-gym generator 'sums'",
         spec_with("name: basic_arithmetic", "name: sums")),
    Case("unit-tests-on-a-dataset-without-tests",
         r"task\.reward\.kind: unit_tests runs each example's tests, but 30 of the 30 examples .*"
         r"'test' and 'entry_point'",
         spec_with("  tools:", "  reward: {kind: unit_tests, extract: code}\n  tools:")),
    Case("rg-options-that-fail-when-drawn",  # reasoning-gym checks these only per item
         r"task\.dataset\.options: simple_equations rejected them: .*number of weights",
         spec_with("name: basic_arithmetic, size: 30", "name: simple_equations, size: 30, "
                   "options: {operators: ['+']}")),
    Case("oversample-with-rft", r"rl: .*oversample keeps the inputs whose samples disagree, which rft",
         GOOD + "rl: {algorithm: rft, oversample: 2}\n"),
    Case("unknown-selector", r"evolve\.selection\.kind: unknown selector 'roulette'; known: \['dgm', 'islands', 'map_elites', 'pareto'\]",
         GOOD + "evolve: {selection: {kind: roulette}}\n"),
    Case("unknown-operator-policy", r"evolve\.operator_policy\.kind: unknown operator policy 'greedy'; known: \['adaptive', 'fixed'\]",
         GOOD + "evolve: {operator_policy: {kind: greedy}}\n"),
    Case("unknown-descriptor", r"evolve\.selection\.descriptors\[1\]\.name: unknown descriptor 'beauty'; known: \[",
         GOOD + "evolve: {selection: {kind: map_elites, descriptors: [{name: nodes, bins: [2]}, "
                "{name: beauty, bins: [1]}]}}\n"),
    Case("map-elites-without-descriptors", r"evolve\.selection: .*descriptors: map_elites needs at least one",
         GOOD + "evolve: {selection: {kind: map_elites}}\n"),
    Case("descriptor-bins-not-increasing", r"evolve\.selection\.descriptors\.0\.bins: .*bin edges must increase",
         GOOD + "evolve: {selection: {kind: map_elites, descriptors: [{name: nodes, bins: [3, 2]}]}}\n"),
    Case("novelty-threshold-over-one", r"evolve\.novelty_threshold: .*less than or equal to 1",
         GOOD + "evolve: {novelty_threshold: 1.5}\n"),
    Case("learn-edges-without-probabilistic-edges",
         r"evolve\.operators\[0\]: learn_edges learns edge probabilities, and no seed graph has an edge with p",
         GOOD + "evolve: {operators: [{name: learn_edges}]}\n"),
    Case("curriculum-level-the-generator-rejects", r"rl\.curriculum\.levels\[0\]: .*basic_arithmetic rejected them",
         GOOD + "rl: {enabled: true, curriculum: {levels: [{min_terms: 5, max_terms: 2}]}}\n"),
    Case("unknown-algorithm", r"rl\.algorithm: unknown algorithm 'ppo2'; known: \[", GOOD + "rl: {algorithm: ppo2}\n"),
    Case("unknown-schedule", r"rl\.schedule: unknown schedule 'bandit'; known: \['adaptive', 'fixed'\]",
         GOOD + "rl: {schedule: bandit}\n"),
    Case("adaptive-schedule-without-rl", r"rl: schedule: 'adaptive' chooses between search generations and RL "
         r"phases, but rl\.enabled is false", GOOD + "rl: {schedule: adaptive}\n"),
    Case("reuse-search-without-train-screen", r"rl\.reuse_search: trains on the search's episodes on train "
         r"examples, which only evolve\.cascade\.first_stage: train produces", GOOD + "rl: {reuse_search: true}\n"),
    Case("overlong-buffer-over-max-tokens", r"rl\.overlong: buffer: 30 is larger than max_tokens 20",
         GOOD + "rl: {overlong: {max_tokens: 20, buffer: 30}}\n"),
    Case("unknown-exploration-kind", r"rl\.exploration\.kind: unknown exploration kind 'curiosity'; known: \['count'\]",
         GOOD + "rl: {exploration: {kind: curiosity, beta: 0.1}}\n"),
    Case("unknown-loss", r"rl\.loss: unknown loss 'hinge'; known: \[", GOOD + "rl: {loss: hinge}\n"),
    Case("rl-on-untrainable-backend", r"rl\.enabled: policy\.kind 'scripted' cannot be trained.*\['hf', 'openai', 'vllm'\]",
         GOOD + "rl: {enabled: true}\n"),
    Case("lora-rank-over-vllm-max", r"rl\.lora_rank: 32 exceeds policy\.max_lora_rank \(16\)",
         spec_with("{kind: scripted}", "{kind: vllm}") + "rl: {enabled: true, lora_rank: 32}\n"),
    Case("per-node-adapters-full-finetune", r"rl: .*adapters: per_node trains one LoRA adapter per node",
         GOOD + "rl: {adapters: per_node, full_finetune: true}\n"),
    # -- operator settings (params), checked against what the operator declares
    Case("operator-param-out-of-range", r"evolve\.operators\[0\]\.params: invalid lr: Input should be greater than 0 \(got -1\)",
         GOOD + "evolve: {operators: [{name: learn_edges, params: {lr: -1}}]}\n"),
    Case("operator-param-unknown", r"evolve\.operators\[0\]\.params: invalid iteration: unknown key; did you mean 'iterations'",
         GOOD + "evolve: {operators: [{name: learn_edges, params: {iteration: 8}}]}\n"),
    Case("operator-without-settings", r"evolve\.operators\[0\]\.params: operator 'bootstrap_demos' takes no settings \(got \['n'\]\)",
         GOOD + "evolve: {operators: [{name: bootstrap_demos, params: {n: 2}}]}\n"),
    # -- model names: checked before any model loads
    Case("embedded-model-unknown", r"mutator\.model: unknown embedded model 'embedded:llama-70b'; known: "
         r"\['embedded', 'embedded:gemma-3-270m', 'embedded:qwen2\.5-coder-0\.5b', 'embedded:qwen2\.5-coder-1\.5b'",
         GOOD + "mutator: {model: 'embedded:llama-70b'}\n"),
    Case("model-folder-missing", r"policy\.model: /no/such/model is not a Hugging Face model folder \(no config\.json\)",
         spec_with("{kind: scripted}", "{kind: hf, model: /no/such/model}")),
    # -- model servers: checked before any model loads (nothing listens on port 9 here)
    Case("openai-without-base-url", r"policy: base_url: required for kind openai",
         spec_with("{kind: scripted}", "{kind: openai, model: m}")),
    Case("base-url-on-hf", r"policy: base_url, api_key_env, weights, adapter_dir are for kind openai, not 'hf'",
         spec_with("{kind: scripted}", "{kind: hf, base_url: 'http://127.0.0.1:9/v1'}")),
    Case("openai-server-not-answering", r"mutator\.base_url: no answer from http://127\.0\.0\.1:9/v1/models",
         GOOD + "mutator: {kind: openai, model: m, base_url: 'http://127.0.0.1:9/v1'}\n"),
    Case("openai-key-env-unset", r"mutator\.api_key_env: the environment variable EVOAGENT_TEST_UNSET_KEY is not set",
         GOOD + "mutator: {kind: openai, model: m, base_url: 'http://127.0.0.1:9/v1', "
                "api_key_env: EVOAGENT_TEST_UNSET_KEY}\n"),
    Case("rl-on-openai-policy-without-weights", r"policy\.weights: RL over an openai policy trains a LoRA adapter",
         spec_with("{kind: scripted}", "{kind: openai, model: m, base_url: 'http://127.0.0.1:9/v1'}")
         + "rl: {enabled: true}\n"),
    Case("full-finetune-of-openai-policy", r"rl\.full_finetune: an openai policy is trained through LoRA adapters",
         spec_with("{kind: scripted}", "{kind: openai, model: m, base_url: 'http://127.0.0.1:9/v1', weights: embedded}")
         + "rl: {enabled: true, full_finetune: true}\n"),
    Case("per-node-adapters-on-openai", r"rl\.adapters: per_node serves each node its own adapter, which policy\.kind hf and vllm do",
         spec_with("{kind: scripted}", "{kind: openai, model: m, base_url: 'http://127.0.0.1:9/v1', weights: embedded}")
         + "rl: {enabled: true, adapters: per_node}\n"),
    Case("openai-weights-without-rl", r"policy\.weights: only RL reads it, and rl\.enabled is false",
         spec_with("{kind: scripted}", "{kind: openai, model: m, base_url: 'http://127.0.0.1:9/v1', weights: embedded}")),
    Case("rl-on-openai-policy-server-not-answering", r"policy\.base_url: no answer from http://127\.0\.0\.1:9/v1/models",
         spec_with("{kind: scripted}", "{kind: openai, model: m, base_url: 'http://127.0.0.1:9/v1', weights: embedded}")
         + "rl: {enabled: true}\n"),
    # -- plug-ins and data files
    Case("plugin-missing-module", r"evolve\.operators\[0\]: .*cannot import 'nomodule:fn'.*ModuleNotFoundError",
         GOOD + "evolve: {operators: [{name: 'nomodule:fn'}]}\n"),
    Case("plugin-syntax-error", r"cannot import 'broken_ops:op': SyntaxError",
         GOOD + "evolve: {operators: [{name: 'broken_ops:op'}]}\n", files={"broken_ops.py": "def op(:\n"}),
    Case("plugin-missing-function", r"cannot import 'fine_ops:nothing_here'.*AttributeError",
         GOOD + "evolve: {operators: [{name: 'fine_ops:nothing_here'}]}\n", files={"fine_ops.py": "x = 1\n"}),
    Case("dataset-ref-broken", r"task\.dataset\.ref: cannot import 'gen:make'",
         spec_with("kind: reasoning_gym, name: basic_arithmetic", "kind: python, ref: 'gen:make'"),
         files={"gen.py": "raise RuntimeError('boom')\n"}),
    Case("dataset-jsonl-missing", r"task\.dataset\.path: .*data\.jsonl does not exist",
         spec_with("kind: reasoning_gym, name: basic_arithmetic", "kind: jsonl, path: data.jsonl")),
    Case("dataset-jsonl-bad-line", r"data\.jsonl:2: invalid JSON",
         spec_with("kind: reasoning_gym, name: basic_arithmetic", "kind: jsonl, path: data.jsonl"),
         files={"data.jsonl": '{"input": "1+1", "answer": "2"}\n{oops\n'}),
    Case("splits-larger-than-data", r"task\.splits: train\+val\+test = 12 but the dataset has 5 distinct questions \(5 examples\)",
         spec_with("size: 30", "size: 5")),
    # -- graph files
    Case("graph-missing-file", r"graphs\[0\]: .*nope\.yaml does not exist", spec_with("[g.yaml]", "[nope.yaml]")),
    Case("graph-cycle", r"graphs\[0\] \(g\.yaml\): .*cycle",
         graph=graph_with("edges: [{src: a, dst: b}]", "edges: [{src: a, dst: b}, {src: b, dst: a}]")),
    Case("graph-edge-to-missing-node", r"graphs\[0\] \(g\.yaml\): .*'ghost'",
         graph=graph_with("edges: [{src: a, dst: b}]", "edges: [{src: a, dst: b}, {src: b, dst: ghost}]")),
    Case("graph-unknown-placeholder", r"graphs\[0\] \(g\.yaml\): .*\{answer\}",
         graph=graph_with('template: "{a}"', 'template: "{a} {answer}"')),
    Case("graph-exit-not-a-node", r"graphs\[0\] \(g\.yaml\): .*exit.*'c'", graph=graph_with("exit: b", "exit: c")),
    Case("graph-unknown-node-kind", r"graphs\[0\] \(g\.yaml\): .*nodes\.1",
         graph=graph_with("{kind: llm, id: b,", "{kind: oracle, id: b,")),
    Case("graph-duplicate-node-id", r"graphs\[0\] \(g\.yaml\): duplicate node id\(s\): \['a'\]",
         graph=graph_with("{kind: llm, id: b,", "{kind: llm, id: a,")),
    Case("graph-unknown-tool", r"graphs\[0\] \(g\.yaml\): .*'abacus'",
         graph=graph_with('{kind: llm, id: a, template: "{input}"}', '{kind: tool, id: a, tool: abacus, template: "{input}"}')),
    Case("graph-not-utf8", r"g\.yaml: not UTF-8", graph="entry: a\n# \udcff\n"),
    # -- command lines
    Case("task-file-missing", r"nope\.yaml: file not found", args=["run", "nope.yaml"]),
    Case("task-is-a-folder", r"is a folder, expected a YAML file", args=["run", "."]),
    Case("resume-without-archive", r"--resume: no archive at", args=["run", "task.yaml", "--resume"]),
    Case("ray-address-not-answering", r"--ray: no Ray cluster answers at 127\.0\.0\.1:9",
         args=["run", "task.yaml", "--ray", "127.0.0.1:9"]),
    Case("ray-address-malformed", r"--ray: 'head-node' is not host:port",
         args=["run", "task.yaml", "--ray", "head-node"]),
    Case("memory-from-a-folder-that-is-no-run", r"no archive at .*nowhere",
         args=["run", "task.yaml", "--memory", "nowhere"]),
    Case("memory-with-resume", r"--memory starts a new run's insights; a resumed run keeps its own",
         args=["run", "task.yaml", "--resume", "--memory", "nowhere"]),
    Case("use-insights-without-memory", r"evolve\.operators\[0\]: use_insights injects the insight memory, and evolve\.memory\.enabled is false",
         GOOD + "evolve: {operators: [{name: use_insights}]}\n"),
    Case("archive-not-a-run", r"no archive at .*nowhere", args=["archive", "list", "nowhere"]),
    Case("unknown-command", r"No such command 'frobnicate'", args=["frobnicate"]),
    Case("run-without-task", r"Missing argument 'task'", args=["run"]),
    Case("unknown-option", r"No such option: --generations", args=["run", "task.yaml", "--generations", "3"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_fails_cleanly(case: Case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    if case.spec is not None:
        (tmp_path / "task.yaml").write_bytes(case.spec if isinstance(case.spec, bytes) else case.spec.encode())
    (tmp_path / "g.yaml").write_bytes(case.graph.encode("utf-8", "surrogateescape"))
    for name, text in case.files.items():
        (tmp_path / name).write_text(text)
    result = CliRunner().invoke(app, case.args)
    out = " ".join(result.output.split())
    assert result.exit_code == 2, out
    assert "Traceback" not in out and not isinstance(result.exception, AssertionError | TypeError)
    assert re.search(case.expect, out), out


def test_the_corpus_is_large_and_distinct():
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)


@pytest.fixture
def archive_run(tmp_path) -> Path:
    import yaml

    from evoagent.archive import AgentRecord, GenerationWrite
    from evoagent.graph import graph_from_dict

    g = graph_from_dict(yaml.safe_load(GRAPH), "g")
    twins = [g.replace_node(g.node("a").model_copy(update={"system": f"v{i}"})) for i in range(40)]
    run = tmp_path / "run"
    with Archive(run) as a:
        a.commit_generation(GenerationWrite(0, 0, [
            AgentRecord(t.id, t, (), "seed", 0, 0, "ok", None) for t in twins
        ], [], []))
    return run


def _prefix_shared_by_two(run: Path) -> str:
    with Archive(run, write=False) as a:
        ids = sorted(a.known_ids())
    return next(x[0] for x, y in zip(ids, ids[1:]) if x[0] == y[0])


@pytest.mark.parametrize("what", ["unknown", "ambiguous", "corrupt", "newer-schema"])
def test_archive_reads_fail_cleanly_and_change_nothing(what, archive_run):
    import sqlite3

    db = archive_run / "archive.sqlite"
    agent = "zzzz"
    expect = r"no agent with id 'zzzz'"
    if what == "ambiguous":
        agent, expect = _prefix_shared_by_two(archive_run), r"ambiguous|agents with id"
    elif what == "corrupt":
        db.write_bytes(b"not a database" * 100)
        expect = r"not a readable evoagent archive"
    elif what == "newer-schema":
        with sqlite3.connect(db) as c:
            c.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
        expect = r"archive schema v99, this evoagent reads v3"
    before = db.read_bytes()
    result = CliRunner().invoke(app, ["archive", "show", str(archive_run), agent])
    out = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in out and re.search(expect, out), out
    assert db.read_bytes() == before
