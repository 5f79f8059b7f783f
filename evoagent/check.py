"""Check every *name* a spec uses (graphs, tools, operators and their settings, selectors,
rewards, extractors, datasets, environments, backends) against the registries that hold them,
so a typo fails in a second, naming the field, before any model loads.

It sits above every floor it asks (``spec`` below only parses and validates the file's
schema), and ``runner.prepare`` calls it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from evoagent.errors import EvoagentError, SpecError
from evoagent.evolve.catalog import get_operator
from evoagent.evolve.descriptors import get_descriptor
from evoagent.evolve.operator_policy import get_policy
from evoagent.evolve.selection import get_selector
from evoagent.graph import load_graph
from evoagent.graph import validate as validate_graph
from evoagent.graph.model import AgentGraph, LoopNode
from evoagent.llm.factory import TrainingNeeds, backend_entry, known_backends
from evoagent.rl.curriculum import train_at
from evoagent.spec.config import RunSpec
from evoagent.tasks.code import testable
from evoagent.tasks.datasets import Example, import_ref, known_datasets, task_data
from evoagent.tasks.envs import known_environments, make_episode
from evoagent.tasks.extract import get_extractor
from evoagent.tasks.rewards import get_reward
from evoagent.tools import known_tools, make_tool


def check_spec(spec: RunSpec) -> None:
    """Resolve every name the spec uses; raise SpecError naming the field of the first bad one.

    The task file's folder goes on ``sys.path`` first, so its ``module:function`` refs (dataset,
    reward, operators, tools) import the modules beside it, as ``python script.py`` would.
    """
    base = str(spec.base_dir)
    if base not in sys.path:
        sys.path.insert(0, base)
    tools = set(known_tools())
    for i, name in enumerate(spec.task.tools):
        try:
            make_tool(name)
        except EvoagentError as e:
            raise SpecError(f"task.tools[{i}]: {e}") from None
        tools.add(name)
    graphs = []
    for i, g in enumerate(spec.graphs):
        path = spec.resolve(g)
        if not path.is_file():
            raise SpecError(f"graphs[{i}]: {path} does not exist")
        try:
            graphs.append(validate_graph(load_graph(path), tools, known_environments()))
        except EvoagentError as e:
            raise SpecError(f"graphs[{i}] ({path.name}): {e}") from None
    for i, op in enumerate(spec.evolve.operators):
        try:
            entry = get_operator(op.name)
        except SpecError as e:
            raise SpecError(f"evolve.operators[{i}]: {e}") from None
        entry.configured(op.params, f"evolve.operators[{i}].params")
        why = entry.check(graphs, spec) if entry.check is not None else None
        if why is not None:
            raise SpecError(f"evolve.operators[{i}]: {why}")
    get_selector(spec.evolve.selection.kind)
    for i, axis in enumerate(spec.evolve.selection.descriptors):
        try:
            get_descriptor(axis.name)
        except SpecError as e:
            raise SpecError(f"evolve.selection.descriptors[{i}].name: {e}") from None
    get_policy(spec.evolve.operator_policy.kind)
    get_reward(spec.task.reward.kind)
    if spec.task.reward.kind == "python":  # the user's reward must import before a model loads
        if spec.task.reward.ref is None:
            raise SpecError("task.reward.ref: required for kind python ('module:function')")
        import_ref(spec.task.reward.ref, "task.reward.ref")
    try:
        get_extractor(spec.task.reward.extract)
    except SpecError as e:
        raise SpecError(f"task.reward.extract: {e}") from None
    if spec.task.dataset.kind not in known_datasets():
        raise SpecError(
            f"task.dataset.kind: unknown dataset {spec.task.dataset.kind!r}; known: {known_datasets()}"
        )
    # Generators and files are cheap next to a model load: build the splits once here, so a
    # dataset that is too small or malformed fails now, not after the model has loaded.
    examples, _ = task_data(spec.task, spec.seed, Path(spec.base_dir))
    if spec.task.reward.kind == "unit_tests" and (bare := [e for e in examples if not testable(e)]):
        raise SpecError(
            f"task.reward.kind: unit_tests runs each example's tests, but {len(bare)} of the "
            f"{len(examples)} examples of task.dataset (e.g. {bare[0].id!r}) have none: they need "
            "'test' and 'entry_point' fields, as the humaneval dataset's examples have"
        )
    _check_envs(graphs, examples)
    _check_schedule(spec)
    _check_curriculum(spec)
    if spec.evolve.children == 0 and not spec.rl.enabled:
        raise SpecError("evolve.children: 0 searches no programs, and with rl.enabled false the "
                        "run would do nothing after the seeds")
    if spec.evolve.cascade.first_stage == "train" and spec.task.splits.train == 0:
        raise SpecError("evolve.cascade.first_stage: train screens children on train examples, but "
                        "task.splits.train is 0")
    if spec.rl.reuse_search and spec.rl.algorithm == "dpo":
        raise SpecError("rl.reuse_search: dpo pairs archived episodes already; the search's are "
                        "among them (set reuse_search: false)")
    if spec.rl.reuse_search and spec.evolve.cascade.first_stage != "train":
        raise SpecError("rl.reuse_search: trains on the search's episodes on train examples, which "
                        "only evolve.cascade.first_stage: train produces")
    if spec.rl.enabled and spec.task.splits.train == 0:
        raise SpecError("rl.enabled: task.splits.train is 0, so the RL phase has nothing to train on")
    for field, cfg in (("policy", spec.policy), ("mutator", spec.mutator)):
        if cfg is not None and cfg.kind not in known_backends():
            raise SpecError(f"{field}.kind: unknown backend {cfg.kind!r}; known: {known_backends()}")
    if spec.mutator is not None and spec.mutator.weights is not None:
        raise SpecError("mutator.weights: only the policy is trained; the mutator is served as it is")
    if spec.policy.weights is not None and not spec.rl.enabled:
        raise SpecError("policy.weights: only RL reads it, and rl.enabled is false")
    if spec.rl.enabled:
        entry = backend_entry(spec.policy.kind)
        if not entry.trainable:
            trainable = [k for k in known_backends() if backend_entry(k).trainable]
            raise SpecError(f"rl.enabled: policy.kind {spec.policy.kind!r} cannot be trained; "
                            f"trainable backends: {trainable}")
        needs = TrainingNeeds(spec.rl.lora_rank, spec.rl.full_finetune, spec.rl.per_node)
        why = entry.train_check(spec.policy, needs) if entry.train_check is not None else None
        if why is not None:
            raise SpecError(why)


def _check_envs(graphs: list[AgentGraph], examples: list[Example]) -> None:
    """A seed graph's ``env`` loop must be able to start an episode from this dataset's
    examples (a textarena env on arithmetic questions would score every run 0 silently)."""

    for i, graph in enumerate(graphs):
        for node in graph.nodes:
            if isinstance(node, LoopNode) and node.env is not None and examples:
                try:
                    make_episode(node.env, examples[0])
                except Exception as e:  # the env's own error says what it missed
                    raise SpecError(
                        f"graphs[{i}] node {node.id!r}: env {node.env!r} cannot play "
                        f"task.dataset's examples: {e}"
                    ) from None


def _check_curriculum(spec: RunSpec) -> None:
    """Each curriculum level must be options the task's generator accepts (drawn now, as the
    task's own are, so a bad level fails before any model loads)."""

    levels = spec.rl.curriculum.levels
    if levels and spec.task.dataset.kind not in ("reasoning_gym", "python"):
        raise SpecError(f"rl.curriculum.levels: a {spec.task.dataset.kind} dataset has no generator "
                        "options to make harder (reasoning_gym and python datasets do)")
    for i in range(len(levels)):
        try:
            train_at(i + 1, spec.task.dataset, spec.rl.curriculum, max(1, spec.task.splits.train),
                     spec.seed, Path(spec.base_dir))
        except SpecError as e:
            raise SpecError(f"rl.curriculum.levels[{i}]: {e}") from None


def _check_schedule(spec: RunSpec) -> None:
    """A decaying schedule must cover every RL step the run will take: past its end linear
    trains at lr 0 and cosine climbs back up."""
    rl = spec.rl
    if not rl.enabled or rl.lr_schedule == "constant" or rl.schedule_steps is None:
        return
    total = spec.evolve.generations // rl.every * rl.steps
    if rl.schedule_steps < total:
        raise SpecError(
            f"rl.schedule_steps: {rl.schedule_steps} but the run takes {total} RL steps "
            f"(evolve.generations // rl.every x rl.steps); the {rl.lr_schedule} schedule would "
            "run past its end"
        )
