"""Every example a user may run passes the spec check (names, files, refs, datasets)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evoagent.check import check_spec
from evoagent.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*/task.yaml"))


def test_the_examples_are_there():
    assert {p.parent.name for p in EXAMPLES} >= {"arithmetic", "chained_ops", "equations", "frozenlake",
                                               "humaneval", "long_chains", "sums"}


@pytest.mark.parametrize("task", EXAMPLES, ids=lambda p: p.parent.name)
def test_example_passes_the_spec_check(task):
    spec = load_spec(task)
    check_spec(spec)
    assert spec.task.splits.val > 0 and spec.graphs
