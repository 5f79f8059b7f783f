"""GPTSwarm's edge optimization (``learn_edges``): on a graph where one edge clearly helps and
one clearly hurts, REINFORCE over sampled sub-graphs keeps the first and prunes the second."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest

from evoagent.errors import MutationError
from evoagent.evolve.catalog import get_operator
from evoagent.evolve.edge_learning import needs_edges
from evoagent.evolve.operators import MutationContext
from evoagent.execute.executor import ExecContext, execute
from evoagent.graph import graph_from_dict, validate
from evoagent.llm.scripted import ScriptedBackend
from evoagent.tasks.datasets import Example
from evoagent.tools import ToolContext, known_tools

SWARM = graph_from_dict({
    "name": "swarm", "entry": "hint", "exit": "answer",
    "nodes": [{"kind": "llm", "id": "hint", "system": "HINT", "template": "{input}"},
              {"kind": "llm", "id": "noise", "system": "NOISE", "template": "{input}"},
              {"kind": "llm", "id": "answer", "system": "ANSWER",
               "template": "{input}\nHint: {hint}\nOther: {noise}"}],
    "edges": [{"src": "hint", "dst": "noise"}, {"src": "hint", "dst": "answer", "p": 0.5},
              {"src": "noise", "dst": "answer", "p": 0.5}],
}, "test graph")
TRAIN = [Example(f"t{i}", f"question {i}", "7") for i in range(8)]


def reply(request) -> str:
    """The hint helps the answer node, the noise misleads it whenever it is seen."""
    system = request.messages[0]["content"]
    prompt = request.messages[-1]["content"]
    if system == "HINT":
        return "the answer is 7"
    if system == "NOISE":
        return "it must be 3"
    return "3" if "must be 3" in prompt else "7" if "answer is 7" in prompt else "0"


def context(seed: int) -> MutationContext:
    backend = ScriptedBackend(handler=reply)
    exec_ctx = ExecContext(backend, ToolContext(), seed=0)
    rng = random.Random(seed)

    async def evaluate(graph, n):
        ts = [await execute(graph, ex, exec_ctx) for ex in rng.sample(TRAIN, n)]
        return [float(t.output == "7") for t in ts]

    return MutationContext(llm=backend, rng=rng, task="t", evaluate=evaluate)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_helpful_edge_is_kept_and_the_harmful_one_pruned(seed):
    child = validate(asyncio.run(get_operator("learn_edges").apply([SWARM], context(seed))), known_tools())
    assert [(e.src, e.dst, e.p) for e in child.edges] == [("hint", "answer", None)]
    assert {n.id for n in child.nodes} == {"hint", "answer"}  # noise no longer leads anywhere
    assert "{noise}" not in child.node("answer").template


def test_it_refuses_a_graph_without_probabilistic_edges():
    plain = SWARM.model_copy(update={"edges": tuple(e.model_copy(update={"p": None}) for e in SWARM.edges)})
    with pytest.raises(MutationError, match="no edge with a probability"):
        asyncio.run(get_operator("learn_edges").apply([plain], context(0)))
    spec = lambda train: SimpleNamespace(task=SimpleNamespace(splits=SimpleNamespace(train=train)))  # noqa: E731
    assert "no seed graph has an edge with p" in needs_edges([plain], spec(8))
    assert "task.splits.train is 0" in needs_edges([SWARM], spec(0))
    assert needs_edges([plain, SWARM], spec(8)) is None


def test_its_settings_come_from_task_yaml_and_bound_the_work():
    """iterations x samples x inputs executions per child, as the task's params say."""
    op = get_operator("learn_edges").configured({"iterations": 1, "samples": 2, "inputs": 1})
    assert op.settings.lr == 4.0 and op.settings.keep == 0.5  # unset ones keep their defaults
    calls = []
    base = context(0)

    async def counted(graph, n):
        calls.append(n)
        return await base.evaluate(graph, n)

    ctx = MutationContext(llm=base.llm, rng=base.rng, task="t", evaluate=counted, settings=op.settings)
    try:
        asyncio.run(op.apply([SWARM], ctx))
    except MutationError:
        pass  # one step may leave the graph as it was; the work done is what is checked
    assert calls == [1, 1]
    strict = get_operator("learn_edges").configured({"keep": 0.999})
    kept = asyncio.run(strict.apply([SWARM], MutationContext(llm=base.llm, rng=random.Random(0), task="t",
                                                              evaluate=context(0).evaluate, settings=strict.settings)))
    assert all(e.p is not None for e in kept.edges if (e.src, e.dst) == ("hint", "answer"))
