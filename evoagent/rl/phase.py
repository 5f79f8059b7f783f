"""The inner loop as the search sees it: roll out the elite agents on train inputs, G samples
per input, compute group advantages, take ``rl.steps`` optimizer steps, checkpoint.

The policy trains in place: LoRA is attached to the backend's own model, so weight sync to the
backend is immediate (the loop then bumps ``weights_version``, which retires cached
completions). Every step re-samples with the current weights (on-policy). Rollout seeds include
the step index, so no two steps ever share a request and the cache can never serve a stale
completion inside a phase.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from evoagent.errors import RLError, SpecError
from evoagent.execute.evaluate import rollout
from evoagent.execute.executor import ExecContext, request_seed
from evoagent.graph.model import AgentGraph
from evoagent.llm.backend import Backend, SupportsTraining
from evoagent.rl.batch import build_batch, episode_advantages
from evoagent.rl.config import RLConfig
from evoagent.rl.policy import attach_lora
from evoagent.rl.trainer import Trainer
from evoagent.spec.config import RewardConfig
from evoagent.tasks.datasets import Example


class RLPhase:
    """Owns the trainer; ``train`` runs one RL phase, ``restore`` reloads a checkpoint."""

    def __init__(
        self, cfg: RLConfig, backend: Backend, ctx: ExecContext, reward: RewardConfig,
        run_dir: Path, seed: int,
    ) -> None:
        if not isinstance(backend, SupportsTraining):
            raise SpecError("rl.enabled: the policy backend cannot be trained in place (use kind: hf)")
        self.cfg = cfg
        self.backend = backend
        self.ctx = replace(ctx, temperature=cfg.temperature)  # same gate, tools and budgets
        self.reward = reward
        self.dir = Path(run_dir) / "checkpoints"
        self.seed = seed
        self.trainer: Trainer | None = None

    def _trainer(self) -> Trainer:
        if self.trainer is None:
            # LoRA's A matrices are drawn from torch's global RNG: seed it from the run seed so a
            # resumed run initialises the adapter exactly as the uninterrupted run did.
            with torch.random.fork_rng():
                torch.manual_seed(request_seed(self.seed, "lora") % 2**31)
                model = attach_lora(self.backend.trainable_model(), self.cfg)
            self.trainer = Trainer(model, self.cfg, pad_id=self.backend.pad_id, seed=self.seed)
        return self.trainer

    def restore(self, path: str, version: int) -> None:
        """Load the checkpoint at ``path`` (relative to the run folder) and serve it as ``version``."""
        self._trainer().load_checkpoint(self.dir.parent / path)
        self.backend.set_weights_version(version)

    async def train(
        self, elite: Sequence[AgentGraph], train: Sequence[Example], generation: int,
        on_step: Callable[[], None] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Run ``rl.steps`` on-policy steps; return the checkpoint path and metrics (means over
        the phase, and each step's under ``"per_step"``)."""
        if not train:
            raise SpecError("rl.enabled: task.splits.train is 0, so there is nothing to train on")
        trainer = self._trainer()
        totals: dict[str, float] = {}
        per_step: list[dict[str, float]] = []
        trained = 0
        for step in range(self.cfg.steps):
            rng = random.Random(request_seed(self.seed, "rl", generation, step))
            inputs = rng.sample(list(train), min(self.cfg.inputs_per_step, len(train)))
            first = 1_000_000 * generation + self.cfg.group_size * step
            trajs = await rollout([
                (g, ex, first + k) for g in elite for ex in inputs for k in range(self.cfg.group_size)
            ], self.ctx, self.reward)
            rewards = [t.reward or 0.0 for t in trajs]
            reward_mean = sum(rewards) / len(rewards)
            accuracy = sum(r >= 1.0 for r in rewards) / len(rewards)
            totals["reward_mean"] = totals.get("reward_mean", 0.0) + reward_mean
            per_step.append({"step": float(step), "reward_mean": reward_mean, "accuracy": accuracy})
            steps, advs = episode_advantages(trajs, lambda t: (t.agent_id, t.input_id), self.cfg)
            if not steps:
                if on_step is not None:
                    on_step()
                continue  # every group had equal rewards: no gradient (DAPO dynamic sampling)
            batch = build_batch(steps, advs, self.backend.pad_id)
            try:
                metrics = await asyncio.to_thread(trainer.train_step, batch)
            except RLError as e:
                raise RLError(f"RL step {step} of generation {generation}: {e}") from e
            trained += 1
            per_step[-1].update(metrics)
            if on_step is not None:
                on_step()
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v
        out: dict[str, Any] = {
            k: v / max(trained if k != "reward_mean" else self.cfg.steps, 1) for k, v in totals.items()
        }
        out["steps_trained"] = float(trained)
        out["per_step"] = per_step  # the report's RL curves
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"gen{generation:03d}.pt"
        trainer.save_checkpoint(path)
        return str(path.relative_to(self.dir.parent)), out  # relative: the run folder may move
