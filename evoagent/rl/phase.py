"""The inner loop as the search sees it: roll out the elite agents on train inputs, G samples
per input, compute group advantages (or, for ``dpo``, preference pairs with the archive's
earlier trajectories of the same inputs), take ``rl.steps`` optimizer steps, checkpoint.

The policy trains on the backend's training copy (``trainable_model``) and every optimizer step
is synced to the backend (``sync_weights``: LoRA merged into the generation weights), so every
step re-samples with the current weights (on-policy; a sync also empties the completion
cache); after the phase the loop bumps ``weights_version``. Under ``dpo`` and ``rft`` the
rollouts go back to the loop, which archives them (split ``train``, tagged with the weights
version the phase started from): later DPO pairs come from there, and ``rft`` also trains on
the archive's earlier successes on a step's inputs, so an input the current weights no longer
solve still teaches what solved it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from evoagent.errors import RLError, SpecError
from evoagent.execute.evaluate import rollout
from evoagent.execute.executor import ExecContext, request_seed
from evoagent.execute.trajectory import SKIPS, Trajectory
from evoagent.graph.model import AgentGraph
from evoagent.llm.backend import Backend, SupportsTraining
from evoagent.rl.batch import build_batch, episode_advantages, preference_pairs
from evoagent.rl.config import DPO, RFT, RLConfig
from evoagent.rl.curriculum import draw_inputs, success_rates
from evoagent.rl.policy import attach_lora
from evoagent.rl.shaping import make_explorer
from evoagent.rl.trainer import Trainer
from evoagent.spec.config import RewardConfig
from evoagent.tasks.datasets import Example


@dataclass
class PhaseResult:
    """What one RL phase leaves: the checkpoint (relative to the run folder), metrics (means
    over the phase, each step's under ``"per_step"``), and every rollout. ``archive`` says
    whether the archive should keep the rollouts (split ``train``): ``dpo`` reads them back
    as pairs, ``rft`` their successes and the curriculum its record of each input; the others
    never do, and multi-turn rollouts are large."""

    checkpoint: str
    metrics: dict[str, Any]
    rollouts: list[Trajectory] = field(repr=False, default_factory=list)
    archive: bool = False


START = "start.pt"  # the trainer before any phase: what a rollback to the base weights loads
History = Callable[[Sequence[str]], list[Trajectory]]  # input ids -> archived train trajectories


GroupOf = Callable[[Trajectory], tuple[str, ...]]


def by_agent(t: Trajectory) -> tuple[str, ...]:
    """The usual GRPO group: one agent's samples on one input."""
    return (t.agent_id, t.input_id)


def _row(step: int, usable: Sequence[Trajectory], spread: set[str]) -> dict[str, float]:
    """A step's metrics row: its samples' mean reward and accuracy, and the inputs with signal."""
    rewards = [t.reward or 0.0 for t in usable] or [0.0]
    return {"step": float(step), "reward_mean": sum(rewards) / len(rewards),
            "accuracy": sum(r >= 1.0 for r in rewards) / len(rewards), "inputs_with_signal": float(len(spread))}


def _groups(trajs: Sequence[Trajectory], group_of: GroupOf, bonus: Sequence[float] | None) -> dict:
    """group -> (its input, the distinct rewards of its samples, each plus its ``bonus``)."""
    extra = bonus if bonus is not None else [0.0] * len(trajs)
    out: dict[tuple[str, ...], tuple[str, set[float]]] = {}
    for t, b in zip(trajs, extra, strict=True):
        out.setdefault(group_of(t), (t.input_id, set()))[1].add(round((t.reward or 0.0) + b, 9))
    return out


def _signal_share(trajs: Sequence[Trajectory], group_of: GroupOf, bonus: Sequence[float] | None = None) -> float:
    """The share of groups whose rewards (plus ``bonus``, one per trajectory) differ: the groups
    a group-relative advantage learns from."""
    groups = _groups(trajs, group_of, bonus)
    return sum(len(r) > 1 for _, r in groups.values()) / max(len(groups), 1)


def _inputs_with_signal(
    trajs: Sequence[Trajectory], group_of: GroupOf = by_agent, bonus: Sequence[float] | None = None
) -> set[str]:
    """Inputs on which some group's rewards (plus ``bonus``) differ: the only ones a
    group-relative advantage learns from."""
    return {i for i, r in _groups(trajs, group_of, bonus).values() if len(r) > 1}


class RLPhase:
    """Owns the trainer; ``train`` runs one RL phase, ``restore`` reloads a checkpoint.

    ``history`` reads the archive's earlier train-split trajectories of some inputs; the
    ``dpo`` algorithm pairs them with the fresh rollouts, ``rft`` adds their successes.
    """

    def __init__(
        self, cfg: RLConfig, backend: Backend, ctx: ExecContext, reward: RewardConfig,
        run_dir: Path, seed: int, history: History | None = None,
    ) -> None:
        if not isinstance(backend, SupportsTraining):
            raise SpecError("rl.enabled: the policy backend cannot be trained in place (use kind: hf)")
        self.cfg = cfg
        self.backend = backend
        # same gate, tools and budgets; per node, each node asks for its own adapter
        self.ctx = replace(ctx, temperature=cfg.temperature, node_adapters=cfg.per_node)
        self.reward = reward
        self.dir = Path(run_dir) / "checkpoints"
        self.seed = seed
        self.history = history
        self.trainer: Trainer | None = None
        self.explorer = make_explorer(cfg.exploration.kind, cfg.exploration.beta) if cfg.exploration else None
        self._adapters: set[str] = set()  # per node: the adapters that existed before this phase

    def _trainer(self) -> Trainer:
        if self.trainer is None:
            # LoRA's A matrices are drawn from torch's global RNG: seed it from the run seed so a
            # resumed run initialises the adapter exactly as the uninterrupted run did.
            with torch.random.fork_rng():
                torch.manual_seed(request_seed(self.seed, "lora") % 2**31)
                model = attach_lora(self.backend.trainable_model(), self.cfg)
            self.trainer = Trainer(model, self.cfg, pad_id=self.backend.pad_id, seed=self.seed)
            if self.cfg.rollback:  # what a rollback to the base weights returns to
                self.trainer.save_checkpoint(self.dir / START)
        return self.trainer

    def restore(self, path: str, version: int) -> None:
        """Load the checkpoint at ``path`` (relative to the run folder) and serve it as ``version``."""
        trainer = self._trainer()
        trainer.load_checkpoint(self.dir.parent / path)
        self.backend.sync_weights(trainer.model)
        self.backend.weights_version = version

    def rollback(self, path: str | None, version: int) -> None:
        """Serve ``version``'s weights again after a phase that hurt: reload the checkpoint at
        ``path``, or with None the trainer as it was before its first step (``START``), so the
        run goes on exactly as a run resumed at ``version`` would. Per node, the adapters the
        phase created are deleted: the nodes they served go back to the base weights."""
        trainer = self._trainer()
        trainer.drop_adapters(self._adapters)
        trainer.load_checkpoint(self.dir / START if path is None else self.dir.parent / path)
        self.backend.sync_weights(trainer.model)
        self.backend.weights_version = version

    def weights(self) -> dict[str, torch.Tensor]:
        """The trainable weights now served (a LoRA state dict, or every weight)."""
        return self._trainer().weights()

    async def train(
        self, elite: Sequence[AgentGraph], train: Sequence[Example], generation: int,
        on_step: Callable[[], None] | None = None, reserve: Sequence[AgentGraph] = (),
        reused: Sequence[Trajectory] = (),
    ) -> PhaseResult:
        """Run ``rl.steps`` on-policy steps and checkpoint.

        ``reused`` (``rl.reuse_search``): the search's episodes on train inputs under the weights
        this phase starts from. The first step trains on them, grouped by input across the
        agents that ran it, instead of on fresh rollouts; when they carry no signal it rolls out
        as usual. Search episodes are decoded at the nodes' temperature (greedy by default), so
        they are not draws from the policy: their stored logprobs (at temperature 1) make the
        PPO ratio exactly 1 at this first step, which then trains like a group-relative RFT of
        the search's decodes (successes up, failures down, the input's mean as baseline), and
        the truncated importance weight (``tis_cap``) bounds the sampler mismatch.

        ``reserve`` (``rl.spread_agents``): other archived agents, rolled out on the inputs
        where the elite's samples all scored the same; on those inputs the group is the input
        (every agent's samples), elsewhere it is (agent, input).

        A sample whose reward failed or whose episode outgrew the context window is left out
        and counted (``skipped_reward``, ``skipped_context``); a step without any signal (all
        groups equal, no pair) trains nothing and is left out of ``steps_trained``.
        """
        if not train:
            raise SpecError("rl.enabled: task.splits.train is 0, so there is nothing to train on")
        trainer = self._trainer()
        self._adapters = set(getattr(trainer.model, "peft_config", ()))  # before the phase adds any
        per_step: list[dict[str, float]] = []
        rollouts: list[Trajectory] = []
        trained = 0
        curriculum = self.cfg.curriculum.enabled
        archived = self.history([ex.id for ex in train]) if curriculum and self.history else []
        first = 0
        if reused:
            row = await self._train_on_search(trainer, reused, train)
            if row is not None:
                per_step.append(row)
                trained, first = 1, 1
                await asyncio.to_thread(self.backend.sync_weights, trainer.model)
                if on_step is not None:
                    on_step()
        for step in range(first, self.cfg.steps):
            rng = random.Random(request_seed(self.seed, "rl", generation, step))
            drawn = min(self.cfg.inputs_per_step * self.cfg.oversample, len(train))
            if curriculum:  # the inputs the elite solve sometimes come first
                rates = success_rates(archived + rollouts)  # the archive's record and this phase's
                inputs = draw_inputs(train, drawn, rates, self.cfg.curriculum, rng)
            else:
                inputs = rng.sample(list(train), drawn)
            first = 1_000_000 * generation + self.cfg.group_size * step
            trajs = await rollout([
                (g, ex, first + k) for g in elite for ex in inputs for k in range(self.cfg.group_size)
            ], self.ctx, self.reward)
            flat: set[str] = set()
            if reserve:
                flat = {ex.id for ex in inputs} - _inputs_with_signal([t for t in trajs if t.skip is None])
                trajs += await rollout([
                    (g, ex, first + k) for g in reserve for ex in inputs if ex.id in flat
                    for k in range(self.cfg.group_size)
                ], self.ctx, self.reward)
            group_of: GroupOf = lambda t: (t.input_id,) if t.input_id in flat else by_agent(t)  # noqa: E731
            earlier = list(rollouts)
            rollouts.extend(trajs)
            usable = [t for t in trajs if t.skip is None]
            spread = _inputs_with_signal(usable, group_of)
            row = _row(step, usable, spread) | {"inputs_spread_by_reserve": float(len(spread & flat)),
                                                **{f"skipped_{why}": 0.0 for why in SKIPS}}
            bonus = self._explore(usable)
            if self.cfg.oversample > 1:  # train on the inputs where the (shaped) rewards disagree
                shaped = _inputs_with_signal(usable, group_of, bonus)
                inputs = [ex for ex in inputs if ex.id in shaped][: self.cfg.inputs_per_step]
                kept = [k for k, t in enumerate(usable) if t.input_id in {ex.id for ex in inputs}]
                usable, bonus = [usable[k] for k in kept], [bonus[k] for k in kept] if bonus else None
            for t in trajs:
                if t.skip is not None:
                    row[f"skipped_{t.skip}"] = row.get(f"skipped_{t.skip}", 0.0) + 1
            row |= self._signal(usable, group_of, bonus)
            per_step.append(row)
            try:
                metrics = await self._step(trainer, usable, earlier, inputs, group_of, bonus)
            except RLError as e:
                raise RLError(f"RL step {step} of generation {generation}: {e}") from e
            if metrics is not None:
                trained += 1
                row.update(metrics)
                await asyncio.to_thread(self.backend.sync_weights, trainer.model)
            if on_step is not None:
                on_step()
        keys = {k for r in per_step for k in r if k != "step"}
        means = {
            k: sum(r[k] for r in per_step if k in r) / max(sum(k in r for r in per_step), 1)
            for k in keys
        }
        out: dict[str, Any] = {**means, "steps_trained": float(trained), "per_step": per_step}
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"gen{generation:03d}.pt"
        trainer.save_checkpoint(path)
        # relative: the run folder may move
        keep = self.cfg.algorithm in (DPO, RFT) or self.cfg.curriculum.enabled
        return PhaseResult(str(path.relative_to(self.dir.parent)), out, rollouts, keep)

    async def _train_on_search(
        self, trainer: Trainer, reused: Sequence[Trajectory], train: Sequence[Example]
    ) -> dict[str, float] | None:
        """Step 0 on the search's own episodes (see ``train``); None when they have no signal.
        ``requests_saved``: the completions the fresh rollouts of this step would have asked
        for (inputs x group x elite, at the search episodes' LLM calls per episode)."""
        usable = [t for t in reused if t.skip is None]
        group_of: GroupOf = lambda t: (t.input_id,)  # noqa: E731
        ids = {t.input_id for t in usable}
        bonus = self._explore(usable)
        metrics = await self._step(trainer, usable, [], [ex for ex in train if ex.id in ids], group_of, bonus)
        if metrics is None:
            return None
        per_episode = sum(len(t.llm_steps) for t in usable) / len(usable)
        fresh = min(self.cfg.inputs_per_step * self.cfg.oversample, len(train)) * self.cfg.group_size
        return _row(0, usable, _inputs_with_signal(usable, group_of)) | self._signal(usable, group_of, bonus) | {
            "reused_samples": float(len(usable)),
            "requests_saved": fresh * self.cfg.elite * per_episode,
            **metrics,
        }

    def _explore(self, episodes: Sequence[Trajectory]) -> list[float] | None:
        """The explorer sees ``episodes`` and gives each its bonus (None without exploration)."""
        if self.explorer is None:
            return None
        self.explorer.observe(episodes)
        return self.explorer.bonus(episodes)

    @staticmethod
    def _signal(usable: Sequence[Trajectory], group_of: GroupOf, bonus: Sequence[float] | None) -> dict[str, float]:
        """The share of groups with signal in the task's reward and, with a bonus, in the shaped one."""
        out = {"group_signal_share": _signal_share(usable, group_of)}
        if bonus is not None:
            out |= {"exploration_bonus_mean": sum(bonus) / max(len(bonus), 1),
                    "shaped_group_signal_share": _signal_share(usable, group_of, bonus)}
        return out

    async def _step(
        self, trainer: Trainer, usable: list[Trajectory], earlier: list[Trajectory],
        inputs: Sequence[Example], group_of: GroupOf = by_agent, bonus: Sequence[float] | None = None,
    ) -> dict[str, float] | None:
        """One optimizer step on this step's samples (``earlier``: this phase's previous
        rollouts, not archived yet; ``bonus``: an exploration bonus per sample); None when they
        carry no signal."""
        pad = self.backend.pad_id
        if self.cfg.algorithm == DPO:
            ids = {ex.id for ex in inputs}
            older = self.history([ex.id for ex in inputs]) if self.history is not None else []
            pool = [*usable, *(t for t in earlier if t.input_id in ids), *older]
            steps, eps, pairs = preference_pairs(pool, lambda t: t.input_id, self.cfg.dpo_pairs)
            if not pairs:
                return None
            batch = build_batch(steps, [0.0] * len(steps), pad, eps)
            chosen = torch.tensor([c for c, _ in pairs], dtype=torch.long)
            rejected = torch.tensor([r for _, r in pairs], dtype=torch.long)
            return await asyncio.to_thread(trainer.train_pairs, batch, chosen, rejected)
        if self.cfg.algorithm == RFT and self.history is not None:
            older = self.history([ex.id for ex in inputs])
            usable = usable + [t for t in older if t.skip is None and (t.reward or 0.0) >= 1.0]
        steps, advs, eps = episode_advantages(usable, group_of, self.cfg, bonus)
        if not steps:
            return None  # every group had equal rewards: no gradient (DAPO dynamic sampling)
        return await asyncio.to_thread(trainer.train_step, build_batch(steps, advs, pad, eps))
