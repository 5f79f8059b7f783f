"""Multi-turn episodes are token-in/token-out: what the trainer sees is what the backend sampled,
environment tokens are masked, and a masked token gets exactly zero gradient."""

from __future__ import annotations

import asyncio

import pytest
import torch

from evoagent.execute.executor import ExecContext, execute
from evoagent.execute.trajectory import ToolStep
from evoagent.graph.model import AgentGraph, LoopNode
from evoagent.rl.batch import build_batch, episode_advantages
from evoagent.rl.config import RLConfig
from evoagent.rl.losses import LossInputs, get_policy_loss
from evoagent.rl.policy import token_logprobs
from evoagent.tasks.datasets import Example
from evoagent.tasks.envs import environment
from evoagent.tools import ToolContext


class CountDown:
    """Starts at 5, each move counts down one; the score is the share counted."""

    def __init__(self, start: int) -> None:
        self.start = self.n = start

    def observation(self) -> str:
        return f"n={self.n}"

    def step(self, action: str) -> tuple[str, bool]:
        self.n -= 1
        return f"n={self.n}", self.n == 0

    def score(self) -> float:
        return (self.start - self.n) / self.start


@environment("count_down")
def _count_down(example: Example) -> CountDown:
    return CountDown(int(example.meta["start"]))


def _play(backend, turns: int = 3, start: int = 5, sample: int = 0):
    graph = AgentGraph(
        nodes=(LoopNode(id="play", env="count_down", max_turns=turns, max_tokens=6,
                        temperature=1.0),),
        entry="play", exit="play",
    )
    ex = Example("game-0", f"n={start}", "", {"start": start})
    ctx = ExecContext(llm=backend, tool_ctx=ToolContext())
    return asyncio.run(execute(graph, ex, ctx, sample))


def test_each_turn_extends_the_previous_turns_tokens(tiny_backend, tiny_tokenizer):
    backend = tiny_backend()
    traj = _play(backend)
    assert traj.error is None
    llm = traj.llm_steps
    assert len(llm) == 3
    assert [s.tool for s in traj.steps if isinstance(s, ToolStep)] == ["env:count_down"] * 3
    assert traj.env_reward == pytest.approx(3 / 5)
    for prev, nxt in zip(llm, llm[1:]):
        head = prev.prompt_ids + prev.completion_ids
        assert nxt.prompt_ids[: len(head)] == head  # sampled tokens kept verbatim
        between = tiny_tokenizer.decode(list(nxt.prompt_ids[len(head) :]))
        # the env's observation as a user turn, then the assistant header; no re-rendering
        assert "<|im_start|>user\nn=" in between and between.endswith("<|im_start|>assistant\n")


def test_episode_trains_exactly_the_sampled_tokens_with_env_tokens_masked(tiny_backend):
    backend = tiny_backend()
    trajs = [_play(backend, sample=k) for k in range(2)]
    trajs[0].reward, trajs[1].reward = 1.0, 0.0
    steps, adv, eps = episode_advantages(
        trajs, lambda t: t.input_id, RLConfig(algorithm="grpo", dynamic_sampling=False)
    )
    batch = build_batch(steps, adv, backend.pad_id, eps)
    assert batch.rows == 2  # one row per episode, not one per turn
    for row, t in enumerate(trajs):
        last = t.llm_steps[-1]
        n = len(last.prompt_ids) + len(last.completion_ids)
        assert batch.input_ids[row, :n].tolist() == list(last.prompt_ids + last.completion_ids)
        trained = batch.input_ids[row][batch.loss_mask[row] > 0].tolist()
        assert trained == [i for s in t.llm_steps for i in s.completion_ids]
        sampled = [lp for s in t.llm_steps for lp in s.logprobs]
        assert batch.old_logp[row][batch.loss_mask[row] > 0].tolist() == pytest.approx(sampled)

    # the trainer's logprobs of the trained tokens are the backend's (float32, same weights)
    with torch.no_grad():
        logp = token_logprobs(backend.model, batch.input_ids, batch.attention_mask, 1.0)
    keep = batch.loss_mask > 0
    assert torch.allclose(logp[keep], batch.old_logp[keep], atol=1e-4)

    # a masked token (env text, first prompt, padding) gets exactly zero gradient
    leaf = logp.clone().requires_grad_(True)
    inp = LossInputs(logp=leaf, old_logp=logp, advantages=batch.advantages, mask=batch.loss_mask)
    get_policy_loss("clip")(inp, RLConfig(tis_cap=None).loss_config()).loss.backward()
    assert leaf.grad is not None
    assert bool((leaf.grad[~keep] == 0).all())
    assert bool((leaf.grad[keep] != 0).all())


def test_context_overflow_ends_the_episode_and_marks_it_skipped(tiny_backend):
    backend = tiny_backend(max_context=96)
    traj = _play(backend, turns=30, start=30)
    assert traj.skip == "context"
    assert "context window" in (traj.error or "")
