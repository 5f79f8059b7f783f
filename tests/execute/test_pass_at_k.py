"""pass@k (Chen et al. 2021) for agents that sample: the unbiased estimator and its use on an
agent executed several times per input."""

from __future__ import annotations

import asyncio
from math import comb

import pytest

from evoagent.execute.evaluate import pass_at_k, rollout, sampled_pass_at_k
from evoagent.execute.executor import ExecContext
from evoagent.graph.model import AgentGraph, LLMNode
from evoagent.llm.scripted import ScriptedBackend
from evoagent.spec.config import RewardConfig
from evoagent.tasks.datasets import Example
from evoagent.tools import ToolContext


@pytest.mark.parametrize(("n", "c", "k"), [(10, 0, 1), (10, 3, 1), (10, 3, 5), (10, 8, 5), (200, 13, 100)])
def test_pass_at_k_is_the_combinatorial_estimator(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_k_refuses_more_draws_than_samples():
    with pytest.raises(ValueError, match="k=5, n=4"):
        pass_at_k(4, 1, 5)


def test_sampled_pass_at_k_agrees_with_the_samples_it_drew():
    # right on about a third of the seeds: each input passes on some samples and not others
    backend = ScriptedBackend(handler=lambda r: "4" if r.seed % 3 == 0 else "5")
    ctx = ExecContext(backend, ToolContext(), seed=0)
    graph = AgentGraph(entry="a", exit="a", nodes=(LLMNode(id="a"),))
    examples = [Example(f"e{i}", f"question {i}", "4") for i in range(6)]
    reward = RewardConfig(kind="numeric")
    got = asyncio.run(sampled_pass_at_k(graph, examples, ctx, reward, samples=4, ks=(1, 4), temperature=1.0))
    trajs = asyncio.run(rollout([(graph, e, s) for e in examples for s in range(4)],
                                ExecContext(backend, ToolContext(), seed=0, temperature=1.0), reward))
    rewards = [t.reward for t in trajs]
    assert 0 < got[1] < got[4] <= 1
    assert got[1] == pytest.approx(sum(rewards) / len(rewards))  # pass@1: the mean over samples
    assert got[4] == pytest.approx(sum(any(rewards[i : i + 4]) for i in range(0, 24, 4)) / 6)
