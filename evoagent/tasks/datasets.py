"""Where examples come from: a registry of dataset kinds, and the seeded train/val/test split.

Every kind returns a list of ``Example``s. ``reasoning_gym`` draws from one of reasoning-gym's
seeded generators (the examples carry the generator's own entry so its scorer can judge them);
``python`` calls the user's ``module:function(seed, size, **options)``; ``jsonl`` reads a file of
``{"input" | "question", "answer", "id"?}`` lines. Splits are a seeded shuffle cut into disjoint
parts, so the same seed always yields the same val set.
"""

from __future__ import annotations

import importlib
import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evoagent.errors import SpecError
from evoagent.registry import Registry
from evoagent.spec.config import DatasetConfig, SplitsConfig, TaskConfig


@dataclass(frozen=True)
class Example:
    """One task instance: the agent sees ``input``; the reward compares against ``answer``."""

    id: str
    input: str
    answer: str
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


DatasetFn = Callable[[DatasetConfig, int, Path], list[Example]]
_REGISTRY: Registry[DatasetFn] = Registry("dataset", SpecError, field="task.dataset.kind")
dataset = _REGISTRY.register  # ``@dataset("name")``: register ``fn(cfg, seed, base_dir) -> examples``
known_datasets = _REGISTRY.names


def load_examples(cfg: DatasetConfig, seed: int, base_dir: Path) -> list[Example]:
    """All examples of the dataset named by ``cfg.kind``."""
    examples = _REGISTRY.get(cfg.kind)(cfg, seed, base_dir)
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise SpecError("task.dataset: example ids are not unique")
    return examples


def data_seed(task: TaskConfig, run_seed: int) -> int:
    """The seed the dataset is drawn with: ``splits.test_seed`` when the test split is fixed
    across run seeds (so is the pool it is cut from), else the run seed."""
    return run_seed if task.splits.test_seed is None else task.splits.test_seed


def task_data(task: TaskConfig, run_seed: int, base_dir: Path) -> tuple[list[Example], dict[str, list[Example]]]:
    """Every example of the task's dataset and its splits, without the questions of
    ``splits.exclude``."""
    examples = load_examples(task.dataset, data_seed(task, run_seed), base_dir)
    if task.splits.exclude is None:
        return examples, split(examples, task.splits, run_seed)
    seen = excluded_questions(task.splits.exclude, base_dir)
    kept = [e for e in examples if e.input not in seen]
    try:
        return examples, split(kept, task.splits, run_seed)
    except SpecError as e:
        raise SpecError(f"{e} ({len(examples) - len(kept)} of them were left out by task.splits.exclude)") from None


def excluded_questions(path: str, base_dir: Path) -> set[str]:
    """The questions of a ``splits.exclude`` file (``input`` or ``question`` of each line)."""
    f = Path(path) if Path(path).is_absolute() else base_dir / path
    if not f.is_file():
        raise SpecError(f"task.splits.exclude: {f} does not exist")
    out = set()
    for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecError(f"task.splits.exclude: {f}:{n}: invalid JSON: {e.msg}") from None
        text = row.get("input", row.get("question")) if isinstance(row, dict) else None
        if not isinstance(text, str):
            raise SpecError(f"task.splits.exclude: {f}:{n}: needs an 'input' or 'question' string")
        out.add(text)
    return out


def split(examples: list[Example], cfg: SplitsConfig, seed: int) -> dict[str, list[Example]]:
    """Disjoint train/val/test parts of a seeded shuffle, disjoint by question too: a generator
    with a small problem space (two one-digit terms and + or -: 200 questions) repeats inputs,
    and a test question that was also trained on would measure memory, not skill. Repeats after
    the first are dropped (a dataset without repeats splits exactly as a plain shuffle would).
    An environment's episodes are told apart by their seed too: it may drive the environment
    beyond the first observation (a slippery lake, a shuffled deck). With ``cfg.test_seed`` the
    test part comes first from that seed's shuffle, and val and train from ``seed``'s shuffle
    of the rest: the same test set under every run seed."""
    order = list(examples)
    random.Random(seed if cfg.test_seed is None else cfg.test_seed).shuffle(order)
    first: dict[tuple[str, Any], Example] = {}
    for e in order:
        first.setdefault((e.input, e.meta.get("seed")), e)
    distinct = list(first.values())
    need = cfg.train + cfg.val + cfg.test
    if need > len(distinct):
        raise SpecError(
            f"task.splits: train+val+test = {need} but the dataset has {len(distinct)} distinct "
            f"questions ({len(examples)} examples): lower the splits, or raise task.dataset.size "
            "or the generator's difficulty"
        )
    if cfg.test_seed is None:
        return {
            "val": distinct[: cfg.val],
            "test": distinct[cfg.val : cfg.val + cfg.test],
            "train": distinct[cfg.val + cfg.test : need],
        }
    test, rest = distinct[: cfg.test], distinct[cfg.test :]
    random.Random(seed).shuffle(rest)
    return {"val": rest[: cfg.val], "test": test, "train": rest[cfg.val : cfg.val + cfg.train]}


def import_ref(ref: str, field_path: str) -> Any:
    """Resolve ``'module:attr'``; errors name the spec field that held the ref."""
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise SpecError(f"{field_path}: {ref!r} is not of the form 'module:function'")
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as e:  # user code: a SyntaxError or NameError on import is a spec problem too
        raise SpecError(f"{field_path}: cannot import {ref!r}: {type(e).__name__}: {e}") from None


def _coerce(rows: Iterable[Mapping[str, Any]], where: str) -> list[Example]:
    out = []
    for i, row in enumerate(rows):
        text = row.get("input", row.get("question"))
        if text is None or "answer" not in row:
            raise SpecError(f"{where}: example {i} needs 'input' (or 'question') and 'answer'")
        meta = {k: v for k, v in row.items() if k not in ("input", "question", "answer", "id")}
        out.append(Example(str(row.get("id", i)), str(text), str(row["answer"]), meta))
    return out


@dataset("jsonl")
def _jsonl(cfg: DatasetConfig, seed: int, base_dir: Path) -> list[Example]:
    if cfg.path is None:
        raise SpecError("task.dataset.path: required for kind jsonl")
    path = Path(cfg.path) if Path(cfg.path).is_absolute() else base_dir / cfg.path
    if not path.is_file():
        raise SpecError(f"task.dataset.path: {path} does not exist")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SpecError(f"task.dataset.path: {path}:{n}: invalid JSON: {e.msg}") from None
    return _coerce(rows, f"task.dataset.path {path}")


@dataset("python")
def _python(cfg: DatasetConfig, seed: int, base_dir: Path) -> list[Example]:
    if cfg.ref is None:
        raise SpecError("task.dataset.ref: required for kind python ('module:function')")
    fn = import_ref(cfg.ref, "task.dataset.ref")
    return _coerce(list(fn(seed=seed, size=cfg.size, **cfg.options)), f"task.dataset.ref {cfg.ref}")


@dataset("reasoning_gym")
def _reasoning_gym(cfg: DatasetConfig, seed: int, base_dir: Path) -> list[Example]:
    import reasoning_gym as rg
    from reasoning_gym.factory import DATASETS

    if cfg.name not in DATASETS:
        raise SpecError(
            f"task.dataset.name: unknown reasoning-gym generator {cfg.name!r} "
            f"(e.g. {sorted(DATASETS)[:8]}...)"
        )
    try:  # the generator is lazy: some options fail only when an item is drawn
        data = list(rg.create_dataset(cfg.name, seed=seed, size=cfg.size, **cfg.options))
    except (TypeError, ValueError, AssertionError, KeyError, IndexError) as e:
        raise SpecError(f"task.dataset.options: {cfg.name} rejected them: {e}") from None
    return [
        Example(f"{cfg.name}-{i}", e["question"], str(e["answer"]), {"entry": e, "rg": cfg.name})
        for i, e in enumerate(data)
    ]
