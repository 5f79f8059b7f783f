"""Shared fixtures of the RL tests: a tiny random Llama and hand-made LLM steps."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
import transformers

from evoagent.execute.trajectory import LLMStep, ToolStep, Trajectory

PAD = 0
VOCAB = 64

torch.set_num_threads(2)


def tiny_llama() -> transformers.LlamaForCausalLM:
    """A 2-layer random Llama (vocab 64); the same weights on every call."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=PAD,
    )
    return transformers.LlamaForCausalLM(cfg)


@pytest.fixture
def make_model() -> Callable[[], transformers.LlamaForCausalLM]:
    return tiny_llama


def llm_step(
    prompt: Sequence[int],
    completion: Sequence[int],
    *,
    logprobs: Sequence[float] | None = None,
    node: str = "solve",
    anchor: str = "solve:0",
) -> LLMStep:
    """An LLMStep with the given ids; logprobs default to -1.0 per completion token."""
    lp = tuple(logprobs) if logprobs is not None else (-1.0,) * len(completion)
    return LLMStep(
        node=node,
        messages=(),
        text="",
        prompt_ids=tuple(prompt),
        completion_ids=tuple(completion),
        logprobs=lp,
        weights_version=0,
        anchor=anchor,
        finish_reason="stop",
    )


def trajectory(
    agent: str, inp: str, reward: float, steps: Sequence[LLMStep | ToolStep]
) -> Trajectory:
    return Trajectory(agent_id=agent, input_id=inp, input="", steps=list(steps), reward=reward)


@pytest.fixture
def step() -> Callable[..., LLMStep]:
    return llm_step


@pytest.fixture
def traj() -> Callable[..., Trajectory]:
    return trajectory
