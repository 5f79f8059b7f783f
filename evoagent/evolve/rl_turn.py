"""The loop's RL half: whether an RL phase follows a search generation, the phase itself (train
on the elite's rollouts, re-score the top agents under the new weights, keep or roll back), and
the curriculum's promotion after it. ``loop.py`` holds the search and calls in here between
generations; both write only through the generation's ``Pending``, so the archive stays the one
state."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path

from evoagent.archive.store import Archive
from evoagent.evolve.breeding import candidates
from evoagent.evolve.hooks import Reporter, RLHook
from evoagent.evolve.pending import Pending
from evoagent.evolve.pool import Candidate
from evoagent.execute.evaluate import Evaluator
from evoagent.execute.executor import request_seed
from evoagent.execute.trajectory import SKIPS
from evoagent.graph import AgentGraph
from evoagent.llm.backend import Backend
from evoagent.rl.curriculum import LEVEL_KEY, next_level, train_at
from evoagent.rl.rollback import judge
from evoagent.rl.schedule import RL, Step, make_schedule
from evoagent.rl.shaping import EXPLORATION_KEY
from evoagent.spec.config import RunSpec
from evoagent.tasks.datasets import Example, excluded_questions

Checkpoint = tuple[str, dict, int]  # (path, metrics, weights version), as the archive keeps it


class RLTurn:
    """The RL phases of one search over ``archive``. ``splits`` is the search's own dict: a
    curriculum promotion replaces its train split in place. ``serve`` names a weights version and
    hands it to the evaluator; ``requests`` counts the completions asked so far (a step's cost)."""

    def __init__(
        self, spec: RunSpec, archive: Archive, rl: RLHook | None, evaluator: Evaluator, policy: Backend,
        reporter: Reporter, splits: dict[str, list[Example]],
        serve: Callable[[int], Awaitable[None]], requests: Callable[[], int],
    ) -> None:
        self.spec, self.archive, self.evaluator = spec, archive, evaluator
        self.policy, self.reporter, self.splits = policy, reporter, splits
        self.serve, self.requests = serve, requests
        cfg = spec.rl
        self.schedule = make_schedule(cfg.schedule, cfg.every, cfg.schedule_discount, cfg.schedule_explore)
        self.level = archive.meta(LEVEL_KEY) or 0  # the curriculum's (rl/curriculum.py)
        if self.level:
            splits["train"] = self._train_at(self.level)
        self.rl: RLHook | None = None
        if rl is not None:
            self.attach(rl)

    def attach(self, rl: RLHook) -> None:
        """Train with ``rl`` from now on; its exploration bonus resumes from the counts the
        archive kept (a resumed run must not treat every state as new again)."""
        self.rl = rl
        if rl.explorer is not None:
            rl.explorer.load(self.archive.meta(EXPLORATION_KEY) or {})

    def due(self, gen: int, steps: Sequence[Step], pending: Pending, spent: int) -> bool:
        """Whether an RL phase follows generation ``gen``, ``spent`` completions into the run:
        the schedule wants one, and a search generation can still follow it (the last
        generation, or a phase that would spend the rest of ``evolve.max_calls``, would leave
        the run ending on weights no search has used; without a program search,
        ``evolve.children: 0``, there is nothing to end on)."""
        cfg = self.spec
        if self.rl is None or not cfg.rl.enabled or not self.schedule.wants_rl(gen, steps):
            return False
        if cfg.evolve.children == 0:  # RL alone (the headline's rl row): no program to end on
            return True
        if gen >= cfg.evolve.generations:
            self.reporter.log(f"gen {gen}: no RL phase after the last generation: the run ends on "
                              "the program, searched under the final weights")
            return False
        cap = cfg.evolve.max_calls
        if cap is None:
            return True
        # what it asks at most, or the last phase's cost where an agent's episodes asked more
        need = max([s.requests for s in steps if s.kind == RL][-1:] + [self._phase_requests(pending)])
        if spent + need < cap:
            return True
        self.reporter.log(f"gen {gen}: no RL phase: about {need} completions would leave no search "
                          f"generation within evolve.max_calls {cap}; the run ends on the program")
        return False

    def _phase_requests(self, pending: Pending) -> int:
        """What a phase of the agents ranked now asks at most: the elite's rollouts, the
        reserve's (``rl.spread_agents``) as if every input's samples agreed (the reserve rolls out
        only on those, and at a low score most do: priced without them, a phase once spent 3,376
        completions of a 2,000 budget), and the re-scoring of the top agents after it. An
        episode costs the completions that agent's own episodes asked so far (a best-of-5 agent
        asks 5 per input, a plain one 1: a generation's average would price a best-of-5 elite at
        a fraction of its cost)."""
        rl, val = self.spec.rl, len(self.splits["val"])
        pool, _ = self._ranked(pending, pending.version)
        drawn = min(rl.inputs_per_step * rl.oversample, len(self.splits["train"]))
        rolled, rescored = rl.elite + rl.spread_agents, self._rescored()
        cost = [self._per_episode(c.id, pending) for c in pool[: max(rolled, rescored)]]  # the elite lead
        rollouts = rl.steps * drawn * rl.group_size * sum(cost[:rolled])
        rescoring = val * sum(cost[:rescored])
        return round(rollouts + rescoring)

    def _per_episode(self, agent_id: str, pending: Pending) -> float:
        """Completions one episode of ``agent_id`` asked: this generation's, else its archived val
        episodes' (1 for an agent with none)."""
        runs = [t for _, t, _ in pending.trajectories if t.agent_id == agent_id]
        runs = runs or list(self.archive.trajectories(agent_id, "val"))
        return statistics.fmean(len(t.llm_steps) for t in runs) if runs else 1.0

    def _rescored(self) -> int:
        """How many top agents a phase re-scores under its new weights."""
        return max(self.spec.rl.elite, self.spec.evolve.selection.islands * 2)

    async def run(self, pending: Pending, gen: int, version: int) -> tuple[Checkpoint, int, Step]:
        """Train on the elite's rollouts under a new weights version, re-score the top agents,
        and keep the new weights unless the best agent's val fell beyond the noise. Returns the
        checkpoint to archive, the version served from now on and the step's cost and gain."""
        assert self.rl is not None
        asked = self.requests()
        pool, graph = self._ranked(pending, version)
        n = self.spec.rl.elite
        elite = [graph(c) for c in pool[:n]]
        reserve = [graph(c) for c in pool[n : n + self.spec.rl.spread_agents]]
        self.reporter.stage(f"gen {gen}: RL on {len(elite)} elite agent(s)", self.spec.rl.steps)
        reused = [t for split_, t, v in pending.trajectories if split_ == "train" and v == version
                  and self.spec.rl.reuse_search]  # this generation's screen, under these weights
        res = await self.rl.train(elite, self.splits["train"], gen, self.reporter.advance, reserve, reused)
        if res.archive:
            pending.trajectories.extend(("train", t, version) for t in res.rollouts)
        if self.rl.explorer is not None:  # the bonus's counts, kept with the phase that made them
            pending.meta[EXPLORATION_KEY] = self.rl.explorer.state()
        path, metrics = res.checkpoint, res.metrics
        skipped = ", ".join(
            f"{int(sum(s.get(f'skipped_{why}', 0) for s in metrics['per_step']))} ({meaning})"
            for why, meaning in SKIPS.items()
        )
        self.reporter.log(
            f"gen {gen}: RL trained {int(metrics['steps_trained'])}/{self.spec.rl.steps} steps, "
            f"rollout reward {metrics['reward_mean']:.3f}, samples skipped: {skipped}"
        )
        new = max([version, *(r["weights_version"] for r in self.archive.checkpoints())]) + 1
        await self.serve(new)
        pending.version = new
        top = pool[: self._rescored()]
        self.reporter.stage(f"gen {gen}: re-evaluate {len(top)} under weights v{new}",
                            len(top) * len(self.splits["val"]))
        evs = await asyncio.gather(*(
            self.evaluator.evaluate(graph(c), self.splits["val"], self.reporter.advance) for c in top
        ))
        for c, ev in zip(top, evs, strict=True):
            pending.record(c.id, "val", "full", ev)
            self.reporter.log(f"gen {gen}: {c.id} val {c.score:.3f} (v{c.version}) -> {ev.score:.3f} (v{new})")
        verdict = judge(self._outcomes(pool[0].id, version, pending),
                        {t.input_id: t.reward or 0.0 for t in evs[0].trajectories},
                        self.spec.rl.rollback_confidence, request_seed(self.spec.seed, "rollback", gen))
        metrics = {**metrics, "val_change": verdict.change, "val_p_drop": verdict.p_drop}
        gain = max(ev.score for ev in evs) - pool[0].score
        if self.spec.rl.rollback and verdict.hurt:
            metrics["rolled_back"] = True
            previous = [r["path"] for r in self.archive.checkpoints() if r["weights_version"] == version]
            self.rl.rollback(previous[0] if previous else None, version)
            await self.evaluator.sync(self.rl.weights(), version)
            self.policy.weights_version = pending.version = version
            self.reporter.log(f"gen {gen}: weights v{new} rolled back ({verdict.describe()}); the "
                              f"search goes on under v{version}")
        else:
            self._promote(gen, metrics.get("accuracy", 0.0), pending)
            version = new
        step = Step(gen, RL, self.requests() - asked, gain, kept=version == new)
        return (path, metrics, new), version, step

    def _ranked(self, pending: Pending, version: int) -> tuple[list[Candidate], Callable[[Candidate], AgentGraph]]:
        """Every agent under ``version``, best first, this generation's children and re-scored
        parents (not yet committed) by their fresh scores; and how to get each one's graph."""
        fresh = {e.agent_id: e.score for e in pending.evaluations if e.split == "val" and e.stage == "full"}
        graphs = {a.id: a.graph for a in pending.agents if a.id in fresh and a.graph is not None}
        gen = pending.generation
        children = [Candidate(a, fresh[a], 0, 0, gen, version) for a in graphs]
        archived = [
            replace(c, score=fresh[c.id], version=version) if c.id in fresh else c
            for c in candidates(self.archive, version)
        ]
        pool = sorted(archived + children, key=lambda c: (-c.score, c.generation, c.id))
        return pool, lambda c: graphs.get(c.id) or self.archive.graph(c.id)

    def _outcomes(self, agent_id: str, version: int, pending: Pending) -> dict[str, float]:
        """{val input: reward} of one agent under ``version``, archived or from this generation."""
        archived = [(t, version) for t in self.archive.trajectories(agent_id, "val", version)]
        fresh = [(t, v) for split_, t, v in pending.trajectories if split_ == "val" and t.agent_id == agent_id]
        return {t.input_id: t.reward or 0.0 for t, v in archived + fresh if v == version}

    def _promote(self, gen: int, accuracy: float, pending: Pending) -> None:
        """The curriculum: after a phase this accurate, train one level up (kept in the archive)."""
        cfg = self.spec.rl.curriculum
        level = next_level(self.level, accuracy, cfg)
        if level != self.level:
            self.level = pending.meta[LEVEL_KEY] = level
            self.splits["train"] = self._train_at(level)
            self.reporter.log(f"gen {gen}: rollout accuracy {accuracy:.2f} >= {cfg.promote_at:g}: the "
                              f"train split moves to curriculum level {level} of {len(cfg.levels)}")

    def _train_at(self, level: int) -> list[Example]:
        spec = self.spec
        held = {e.input for part in ("val", "test") for e in self.splits[part]}
        if spec.task.splits.exclude is not None:
            held |= excluded_questions(spec.task.splits.exclude, Path(spec.base_dir))
        return train_at(level, spec.task.dataset, spec.rl.curriculum, spec.task.splits.train, spec.seed,
                        Path(spec.base_dir), held)
