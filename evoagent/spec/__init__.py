"""task.yaml: the pydantic schema (``config``), the YAML reader (``load``) and ``load_spec``.

``load_spec`` validates the file's schema; ``check_spec`` then checks every *name* the spec uses
(graphs, tools, operators, rewards, datasets, backends) so a typo fails in a second, naming the
field, before any model loads.
"""

from __future__ import annotations

from pathlib import Path

from evoagent.errors import EvoagentError, SpecError
from evoagent.spec.config import BackendConfig, RunSpec
from evoagent.spec.load import read_yaml, validate


def load_spec(path: Path | str) -> RunSpec:
    """Read and validate a task.yaml; relative paths in it resolve against its folder."""
    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the top level must be a mapping of fields")
    data.setdefault("base_dir", str(path.resolve().parent))
    return validate(RunSpec, data, str(path))


def check_spec(spec: RunSpec) -> None:
    """Resolve every name the spec uses; raise SpecError naming the field of the first bad one."""
    from evoagent.evolve.operators import get_operator
    from evoagent.evolve.selection import get_selector
    from evoagent.graph import load_graph, validate as validate_graph
    from evoagent.llm.backend import known_backends
    from evoagent.tasks.datasets import known_datasets
    from evoagent.tasks.extract import get_extractor
    from evoagent.tasks.rewards import get_reward
    from evoagent.tools import known_tools, make_tool

    tools = set(known_tools())
    for i, name in enumerate(spec.task.tools):
        try:
            make_tool(name)
        except EvoagentError as e:
            raise SpecError(f"task.tools[{i}]: {e}") from None
        tools.add(name)
    for i, g in enumerate(spec.graphs):
        path = spec.resolve(g)
        if not path.is_file():
            raise SpecError(f"graphs[{i}]: {path} does not exist")
        try:
            validate_graph(load_graph(path), tools)
        except EvoagentError as e:
            raise SpecError(f"graphs[{i}] ({path.name}): {e}") from None
    for i, op in enumerate(spec.evolve.operators):
        try:
            get_operator(op.name)
        except SpecError as e:
            raise SpecError(f"evolve.operators[{i}]: {e}") from None
    get_selector(spec.evolve.selection.kind)
    get_reward(spec.task.reward.kind)
    try:
        get_extractor(spec.task.reward.extract)
    except SpecError as e:
        raise SpecError(f"task.reward.extract: {e}") from None
    if spec.task.dataset.kind not in known_datasets():
        raise SpecError(
            f"task.dataset.kind: unknown dataset {spec.task.dataset.kind!r}; known: {known_datasets()}"
        )
    if spec.rl.enabled and spec.task.splits.train == 0:
        raise SpecError("rl.enabled: task.splits.train is 0, so the RL phase has nothing to train on")
    if spec.rl.enabled and spec.policy.kind != "hf":
        raise SpecError(f"rl.enabled: policy.kind {spec.policy.kind!r} cannot be trained in place; use hf")
    for field, cfg in (("policy", spec.policy), ("mutator", spec.mutator)):
        if cfg is not None and cfg.kind not in known_backends():
            raise SpecError(f"{field}.kind: unknown backend {cfg.kind!r}; known: {known_backends()}")


__all__ = ["BackendConfig", "RunSpec", "check_spec", "load_spec"]
