"""The documentation in docs/ says what the code does: the settings reference is generated from
the config models, links resolve, and the code and task.yaml examples run."""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import pytest

from evoagent.spec.reference import settings_markdown

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NO_HEADLINE = "No headline results file is kept at this code"


def _blocks(page: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


def test_the_settings_reference_is_the_one_the_code_writes():
    assert (DOCS / "settings.md").read_text() == settings_markdown(), (
        "docs/settings.md is stale: python -m evoagent.spec.reference > docs/settings.md"
    )


def test_every_settings_key_is_documented():
    from evoagent.spec.config import RunSpec

    text = settings_markdown()
    for name in RunSpec.model_fields:
        if name != "base_dir":
            assert f"| `{name}` |" in text


@pytest.mark.parametrize("page", ["README.md", *sorted(p.name for p in DOCS.glob("*.md"))])
def test_relative_links_resolve(page):
    path = ROOT / page if page == "README.md" else DOCS / page
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
        assert (path.parent / target).exists(), f"{page} links to missing {target}"


def test_the_task_example_loads(tmp_path):
    from evoagent.spec import load_spec

    (block,) = [b for b in _blocks("tasks.md", "yaml") if "\ntask:" in b]
    task = ROOT / "examples" / "arithmetic" / "docs_example.yaml"
    try:
        task.write_text(block)
        spec = load_spec(task)
    finally:
        task.unlink(missing_ok=True)
    assert spec.task.reward.kind == "numeric" and spec.task.tools == ("calculator",)


def test_the_reward_with_feedback_example_scores_and_explains():
    from evoagent.tasks.datasets import Example

    (block,) = _blocks("tasks.md", "python")
    ns: dict = {}
    exec(block, ns)
    ex = Example("1", "Calculate 95 - 21.", "74")
    assert ns["graded"]("74", ex) == 1.0
    assert ns["graded"]("70", ex) == (pytest.approx(0.46), "off by 4")
    assert ns["graded"]("", ex)[0] == 0.0


def test_the_operator_example_registers_and_follows_its_contract():
    from evoagent.errors import MutationError
    from evoagent.evolve.catalog import get_operator
    from evoagent.evolve.operators import MutationContext
    from evoagent.graph import load_graph
    from evoagent.llm.scripted import ScriptedBackend

    (block,) = _blocks("operators.md", "python")
    block = block.replace('"shout"', '"docs_shout"')  # the README registers its own "shout"
    exec(block, {})
    op = get_operator("docs_shout")
    ctx = MutationContext(llm=ScriptedBackend(), rng=random.Random(0), task="t")
    parent = load_graph(ROOT / "graphs" / "direct.yaml")
    child = asyncio.run(op.apply([parent], ctx))
    assert "CAPITALS" in child.node(child.exit).system and child.id != parent.id
    with pytest.raises(MutationError, match="already shouting"):
        asyncio.run(op.apply([child], ctx))


def test_the_readme_shows_the_headline_table_bench_headline_wrote():
    """The README quotes the table bench/headline.py wrote at this code, or, where no run of
    it is kept, says so instead of quoting an older one."""
    table = ROOT / "bench" / "results" / "headline.md"
    readme = (ROOT / "README.md").read_text()
    if table.exists():
        assert table.read_text() in readme, (
            "README's headline table is stale: paste bench/results/headline.md into it"
        )
    else:
        assert NO_HEADLINE in readme, (
            f"bench/results/headline.md is gone: the README's headline section must say {NO_HEADLINE!r}"
        )


def test_the_operator_settings_example_reads_its_params():
    from evoagent.evolve.catalog import get_operator
    from evoagent.evolve.operators import MutationContext
    from evoagent.graph import load_graph
    from evoagent.llm.scripted import ScriptedBackend

    (block,) = _blocks("operators.md", "py")
    exec(block, {})
    op = get_operator("shout_more").configured({"marks": 3}, "evolve.operators[0].params")
    ctx = MutationContext(llm=ScriptedBackend(), rng=random.Random(0), task="t", settings=op.settings)
    child = asyncio.run(op.apply([load_graph(ROOT / "graphs" / "direct.yaml")], ctx))
    assert child.node(child.exit).system.endswith("!!!")

