"""Breeding a generation's children: for each slot an operator (the operator policy) and
parents (the selection strategy, over a pool read from the archive) are drawn, the parent's
executions under the current weights are read (a parent scored under older weights is
re-scored once), the operator builds the child, and the child is validated and, with
``evolve.novelty_threshold``, refused as a duplicate of an archived agent. Slots that gave
nothing new are redrawn; what could not be built is archived with its reason. The loop
(``loop.py``) evaluates what comes out.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from evoagent.archive.records import AgentRecord
from evoagent.archive.store import Archive
from evoagent.archive.views import instance_scores, operator_outcomes
from evoagent.errors import BackendError, GraphError, MutationError, SandboxError
from evoagent.evolve.catalog import get_operator
from evoagent.evolve.descriptors import get_descriptor
from evoagent.evolve.novelty import NoveltyIndex
from evoagent.evolve.operator_policy import Choose, get_policy
from evoagent.evolve.operators import Feedback, MutationContext, Operator
from evoagent.evolve.pending import Pending
from evoagent.evolve.pool import Candidate, Pool, Selector
from evoagent.evolve.selection import get_selector
from evoagent.execute.evaluate import Evaluator
from evoagent.execute.executor import request_seed
from evoagent.execute.trajectory import Trajectory
from evoagent.graph import AgentGraph, graph_from_dict, validate
from evoagent.llm.backend import Backend
from evoagent.spec.config import RunSpec
from evoagent.tasks.datasets import Example
from evoagent.tools import known_tools
from evoagent.usercode import UserCode


def candidates(archive: Archive, version: int) -> list[Candidate]:
    """Every valid agent with a full val score, its latest up to ``version`` (one SQL query,
    no graphs): an RL phase re-scores only the top agents, and the rest stay selectable."""
    return [Candidate(*row) for row in archive.candidates("val", version)]


def selection_pool(archive: Archive, version: int) -> Pool:
    """The selection pool, with what pareto and map_elites read from the archive on demand."""
    cands = candidates(archive, version)

    def instances() -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for v in {c.version for c in cands}:  # each agent's rewards under its own version
            out.update(instance_scores(archive, [c.id for c in cands if c.version == v], v))
        return out

    return Pool(cands, instances, lambda name, ids: get_descriptor(name)(archive, ids))


REDRAWS = 4  # draws per child slot while it rebuilds a known agent or its operator does not apply
MUTATOR_FAILED = "the mutator backend failed"
RESCORE_FAILED = "the backend failed while re-scoring parent"


@dataclass
class Breeder:
    """What building children needs of the run; ``splits`` is the search's own dict (a
    curriculum may replace its train split), ``insights`` and ``weights_version`` are read
    when a child is built."""

    spec: RunSpec
    archive: Archive
    evaluator: Evaluator
    mutator: Backend
    user: UserCode
    splits: dict[str, list[Example]]
    by_id: dict[str, Example]
    insights: Callable[[], list[str]]
    weights_version: Callable[[], int]
    log: Callable[[str], None]
    operators: list[tuple[Operator, float]] = field(init=False)
    select: Selector = field(init=False)
    tools: list[str] = field(init=False)
    _novelty: NoveltyIndex | None = field(default=None, init=False)  # built from the archive when first needed

    def __post_init__(self) -> None:
        self.operators = [(get_operator(o.name).configured(o.params), o.weight) for o in self.spec.evolve.operators]
        self.select = get_selector(self.spec.evolve.selection.kind)
        self.tools = sorted(set(known_tools()) | set(self.spec.task.tools))

    async def breed(self, gen: int, pool: Pool, pending: Pending) -> list[tuple[AgentRecord, AgentGraph]]:
        """This generation's children, one per slot, into ``pending`` (invalid, crashed and
        duplicate ones too, with their reasons); returns the valid ones to evaluate."""
        cfg = self.spec.evolve
        known = self.archive.known_ids()
        rngs = [random.Random(request_seed(self.spec.seed, "child", gen, s)) for s in range(cfg.children)]
        choose = get_policy(cfg.operator_policy.kind)(self.operators, operator_outcomes(self.archive), gen, cfg.operator_policy)
        made = await asyncio.gather(*(
            self._child(gen, s, pool, rngs[s], known, pending, choose) for s in range(cfg.children)
        ))
        children: list[tuple[AgentRecord, AgentGraph]] = []
        for slot, rec in enumerate(made):
            if rec.id in known:  # an earlier slot of this generation built the same child
                rec = await self._child(gen, slot, pool, rngs[slot], known, pending, choose)
            if rec.id in known:
                self.log(f"gen {gen}: {rec.operator} rebuilt existing agent {rec.id}; skipped")
                continue
            rec = self._novel_or_duplicate(rec)  # against the earlier slots too
            if rec.status == "ok" and self._novelty is not None:
                self._novelty.add(rec.id, rec.graph)  # type: ignore[arg-type]
            known.add(rec.id)
            pending.agents.append(rec)
            if rec.status == "ok" and rec.graph is not None:
                children.append((rec, rec.graph))
            else:
                self.log(f"gen {gen}: {rec.operator} -> {rec.status}: {rec.reason}")
        self._record_rescored(gen, pool, pending)
        return children

    async def _child(
        self, gen: int, slot: int, pool: Pool, rng: random.Random, known: set[str], pending: Pending,
        choose: Choose,
    ) -> AgentRecord:
        """Build one child, redrawing operator and parents when the draw gave nothing new.

        Deterministic operators (insert a tool, add demos) rebuild the same child from the same
        parent, and an operator may not apply to the parent drawn (every node already has a
        tool); without a redraw such a slot is lost, and so is one whose child novelty rejection
        refused. After ``REDRAWS`` draws the last one is kept: an invalid or duplicate child is
        archived with its reason, like a crashed one (which is never
        redrawn: an operator bug should show). The draws come from the slot's own seeded RNG,
        so reruns match.
        """
        for _ in range(REDRAWS):
            rec = self._novel_or_duplicate(await self._draw_child(gen, slot, pool, rng, pending, choose))
            if rec.id not in known and rec.status not in ("invalid", "duplicate"):
                break
        return rec

    def _novel_or_duplicate(self, rec: AgentRecord) -> AgentRecord:
        """``rec``, or when novelty rejection is on and an indexed agent is too similar, ``rec``
        as a duplicate naming that agent (``evolve/novelty.py``)."""
        threshold = self.spec.evolve.novelty_threshold
        if threshold is None or rec.status != "ok" or rec.graph is None:
            return rec
        if self._novelty is None:
            self._novelty = NoveltyIndex((a.id, a.graph) for a in self.archive.agents(status="ok") if a.graph)
        near = self._novelty.nearest(rec.graph)
        if near is None or near.similarity < threshold:
            return rec
        return replace(rec, status="duplicate", reason=f"{near.similarity:.2f} similar to {near.id} "
                       f"(evolve.novelty_threshold {threshold:g}); not evaluated")

    async def _draw_child(
        self, gen: int, slot: int, pool: Pool, rng: random.Random, pending: Pending, choose: Choose
    ) -> AgentRecord:
        op = choose(rng)
        parents, island = self.select(pool, op.parents, slot, gen, rng, self.spec.evolve.selection)
        ids = tuple(p.id for p in parents)
        base = dict(parents=ids, operator=op.name, generation=gen, island=island)
        if len(parents) < op.parents:
            return _failed(gen, slot, base, "invalid", f"{op.name} needs {op.parents} parents")
        try:
            seen = await self._current_executions(parents[0], pending)
        except BackendError as e:
            return _failed(gen, slot, base, "crashed", f"{RESCORE_FAILED} {parents[0].id}: {e}")
        ctx = self._mutation_context(seen, rng, pool, op.settings)
        try:
            child = await op.apply([self.archive.graph(p.id) for p in parents], ctx,
                                   self.user, self.spec.evolve.operator_timeout_s)
        except (MutationError, GraphError) as e:
            return _failed(gen, slot, base, "invalid", str(e))
        except BackendError as e:  # the mutator's model failed (its server is gone)
            return _failed(gen, slot, base, "crashed", f"{MUTATOR_FAILED}: {e}")
        except SandboxError:
            raise
        except Exception as e:  # a user's operator is a candidate boundary: archive, go on
            return _failed(gen, slot, base, "crashed", f"{type(e).__name__}: {e}")
        try:
            child = graph_from_dict(child.model_dump(mode="json"), f"{op.name} child")
            validate(child, self.tools)
        except GraphError as e:
            return AgentRecord(child.id, child, status="invalid", reason=str(e), **base)
        return AgentRecord(child.id, child, status="ok", reason=None, **base)

    async def _current_executions(self, parent: Candidate, pending: Pending) -> list[Trajectory]:
        """The parent's val executions under the weights it is now scored with: from the
        archive, or, when its score predates the last RL phase, from re-scoring it now (once per
        generation, however many slots draw it; ``_record_rescored`` archives the score)."""
        if parent.version == pending.version:
            return list(self.archive.trajectories(parent.id, "val", pending.version))
        task = pending.rescored.get(parent.id)
        if task is None:
            graph = self.archive.graph(parent.id)
            task = asyncio.ensure_future(self.evaluator.evaluate(graph, self.splits["val"]))
            pending.rescored[parent.id] = task
        return list((await asyncio.shield(task)).trajectories)

    def _record_rescored(self, gen: int, pool: Pool, pending: Pending) -> None:
        """Archive the parents re-scored this generation, in id order (reruns write alike)."""
        before = {c.id: c for c in pool.candidates}
        for pid in sorted(pending.rescored):
            task = pending.rescored[pid]
            if task.exception() is not None:  # its children are archived as crashed
                continue
            ev = task.result()
            pending.record(pid, "val", "full", ev)
            old = before[pid]
            self.log(f"gen {gen}: parent {pid} val {old.score:.3f} (v{old.version}) -> "
                              f"{ev.score:.3f} (v{ev.weights_version})")

    def _mutation_context(
        self, executions: Sequence[Trajectory], rng: random.Random, pool: Pool, settings: Any = None
    ) -> MutationContext:
        cfg = self.spec.evolve
        version = self.weights_version()
        feedback = [self.feedback(t) for t in executions]
        failures = sorted((f for f in feedback if f.reward < 1.0), key=lambda f: f.reward)
        return MutationContext(
            llm=self.mutator,
            rng=rng,
            task=self.spec.task.description,
            failures=tuple(failures[: cfg.failures_shown]),
            successes=tuple(f for f in feedback if f.reward >= 1.0),
            tools=self.spec.task.tools,
            max_demos=cfg.max_demos,
            extract=self.spec.task.reward.extract,
            insights=tuple(self.insights()[: cfg.memory.top_k]),
            history=lambda: self._trials(pool, version),
            evaluate=lambda graph, n: self._rewards_on_train(graph, n, rng),
            settings=settings,
            sandbox=self.spec.sandbox,
        )

    async def _rewards_on_train(self, graph: AgentGraph, n: int, rng: random.Random) -> list[float]:
        """``ctx.evaluate``: ``graph``'s rewards on ``n`` train inputs drawn with ``rng``."""
        train = self.splits["train"]
        if not train:
            raise MutationError("the task has no train split to try graphs on (task.splits.train)")
        ev = await self.evaluator.evaluate(graph, rng.sample(train, min(n, len(train))))
        return [t.reward or 0.0 for t in ev.trajectories]

    def _trials(self, pool: Pool, version: int) -> list[tuple[AgentGraph, float]]:
        """(graph, score) of every scored agent; children stopped by the cascade are trials
        too, with their minibatch score: TPE learns where not to look. Loaded only when an
        operator asks (param_search), since it reads every graph."""
        scored = [(self.archive.graph(c.id), c.score) for c in pool.candidates if c.version == version]
        stopped = [(a.graph, s) for a, s in self.archive.stopped(self.spec.evolve.cascade.first_stage, version)
                   if a.graph]
        return scored + stopped

    def feedback(self, t: Trajectory) -> Feedback:
        """The mutator's view of an archived execution (with its input's expected answer)."""
        ex = self.by_id.get(t.input_id)
        return Feedback.of(t, ex.answer if ex else "?")


def _failed(gen: int, slot: int, base: dict, status: str, reason: str) -> AgentRecord:
    """The archive row of a child that never became a runnable graph; its id names the slot."""
    return AgentRecord(id=f"x{gen:03d}-{slot:03d}", graph=None, status=status, reason=reason, **base)
