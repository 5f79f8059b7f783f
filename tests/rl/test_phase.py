"""The RL phase end to end on a tiny model: rollouts → advantages → LoRA step, the backend
samples from the trained weights at once (weight sync), and a checkpoint restores them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from evoagent.execute.executor import ExecContext
from evoagent.graph import load_graph
from evoagent.llm.types import GenerationRequest
from evoagent.rl.config import RLConfig
from evoagent.rl.phase import RLPhase
from evoagent.spec.config import RewardConfig
from evoagent.tasks import Example
from evoagent.tools import ToolContext

ROOT = Path(__file__).resolve().parents[2]
GRAPH = load_graph(ROOT / "graphs" / "direct.yaml")
REQ = GenerationRequest(({"role": "user", "content": "Calculate 12 + 7."},), max_tokens=6,
                        temperature=1.0, seed=5)


def parity(answer: str, example) -> float:
    """Partial credit that varies within a group, so GRPO has a signal."""
    return float(len(answer) % 2)


def phase(backend, tmp_path, **cfg) -> RLPhase:
    cfg = RLConfig(enabled=True, group_size=4, inputs_per_step=2, steps=2, lr=5e-2,
                   dynamic_sampling=False, **cfg)
    ctx = ExecContext(backend, ToolContext(), seed=0)
    reward = RewardConfig(kind="python", ref=f"{__name__}:parity", extract="raw")
    return RLPhase(cfg, backend, ctx, reward, tmp_path, seed=0)


def logprobs(backend) -> tuple[float, ...]:
    backend.cache._data.clear()
    return asyncio.run(backend.generate([REQ]))[0].logprobs


def test_train_updates_the_served_policy_and_checkpoints(tiny_backend, tmp_path):
    backend = tiny_backend(cache=True)
    before = logprobs(backend)
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(4)]
    rl = phase(backend, tmp_path)
    path, metrics = asyncio.run(rl.train([GRAPH], train, generation=2))
    assert metrics["steps_trained"] == 2 and "loss" in metrics and 0 <= metrics["reward_mean"] <= 1
    assert (tmp_path / path).is_file()
    after = logprobs(backend)
    assert after != before  # the backend already serves the trained LoRA weights

    fresh = tiny_backend(cache=True)
    phase(fresh, tmp_path).restore(path, version=1)
    assert fresh.weights_version == 1
    assert logprobs(fresh) == after


def test_rft_trains_only_on_successes(tiny_backend, tmp_path):
    backend = tiny_backend()
    train = [Example(str(i), f"Calculate {i} + 1.", str(i + 1)) for i in range(4)]
    _, metrics = asyncio.run(phase(backend, tmp_path, algorithm="rft").train([GRAPH], train, 1))
    assert metrics["steps_trained"] >= 1
