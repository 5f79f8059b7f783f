"""The outer loop: seed, then per generation select, mutate, validate, cascade-evaluate, archive;
every ``rl.every`` generations an RL phase trains the policy on the elite's rollouts.

State lives only in the archive: each generation is computed in memory and written in one
transaction at its end, and every random choice derives from (run seed, generation, slot), so
``--resume`` after a crash or Ctrl-C redoes the unfinished generation exactly as it would have
run. Per-candidate failures (an operator that does not apply, an invalid graph, an operator that
crashes) are archived with the reason. A backend that fails mid-generation (a model server that
stopped answering, after its retries) crashes the candidates it was serving, with the reason;
only when it leaves a generation with nothing evaluated, or fails while seeding, training or
testing, does the run stop (``BackendError``), and ``--resume`` redoes that generation.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evoagent.archive.store import AgentRecord, Archive, EvalRecord, GenerationWrite
from evoagent.archive.views import instance_scores, operator_outcomes
from evoagent.errors import BackendError, EvoagentError, GraphError, MutationError, SandboxError
from evoagent.evolve.cascade import cascade
from evoagent.evolve.descriptors import get_descriptor
from evoagent.evolve.hooks import NullReporter, Reporter, RLHook, SearchResult
from evoagent.evolve.insights import Insight, contrast_pairs, learn
from evoagent.evolve.novelty import NoveltyIndex
from evoagent.evolve.operator_policy import Choose, get_policy
from evoagent.evolve.operators import Feedback, MutationContext, get_operator
from evoagent.evolve.selection import Candidate, Pool, get_selector
from evoagent.execute.evaluate import Evaluation, Evaluator, LocalEvaluator
from evoagent.execute.executor import ExecContext, request_seed
from evoagent.execute.trajectory import SKIPS, Trajectory
from evoagent.graph import AgentGraph, graph_from_dict, load_graph, validate
from evoagent.llm.backend import Backend, total_usage
from evoagent.rl.curriculum import LEVEL_KEY, next_level, train_at
from evoagent.spec.config import RunSpec
from evoagent.tasks.datasets import Example, load_examples, split
from evoagent.tools import ToolContext, known_tools

REDRAWS = 4  # draws per child slot while it rebuilds a known agent or its operator does not apply
MUTATOR_FAILED = "the mutator backend failed"
RESCORE_FAILED = "the backend failed while re-scoring parent"


@dataclass
class _Pending:
    """One generation's writes, accumulated in memory until the commit."""

    generation: int
    version: int
    agents: list[AgentRecord] = field(default_factory=list)
    evaluations: list[EvalRecord] = field(default_factory=list)
    trajectories: list[tuple[str, Trajectory, int]] = field(default_factory=list)
    # parents drawn with a score from older weights, re-scored under ``version`` (once each)
    rescored: dict[str, asyncio.Task[Evaluation]] = field(default_factory=dict)
    insights: list[Insight] | None = None  # the memory after this generation, if it changed
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. the curriculum level, if it moved

    def add_eval(self, agent_id: str, split_: str, stage: str, ev: Evaluation) -> None:
        self.evaluations.append(
            EvalRecord(agent_id, split_, stage, ev.weights_version, ev.score, ev.n, ev.tokens,
                       ev.seconds, self.generation)
        )

    def write(
        self, checkpoint: tuple[str, dict] | None = None, usage: tuple[int, int] | None = None
    ) -> GenerationWrite:
        memory = None if self.insights is None else [(i.text, i.votes) for i in self.insights]
        return GenerationWrite(self.generation, self.version, self.agents, self.evaluations,
                               self.trajectories, checkpoint, usage, memory, self.meta)


class Search:
    """One run of the outer loop over an archive."""

    def __init__(
        self,
        spec: RunSpec,
        policy: Backend,
        mutator: Backend,
        archive: Archive,
        reporter: Reporter | None = None,
        rl: RLHook | None = None,
        evaluator: Evaluator | None = None,
        memory: Sequence[tuple[str, int]] = (),
    ) -> None:
        """``memory``: insights (text, votes) a new run starts from (``--memory``); a resumed
        run reads its own from the archive."""
        self.spec = spec
        self.policy = policy
        self.mutator = mutator
        self.archive = archive
        self.reporter = reporter or NullReporter()
        self.rl = rl
        examples = load_examples(spec.task.dataset, spec.seed, Path(spec.base_dir))
        self.splits = split(examples, spec.task.splits, spec.seed)
        self.by_id = {e.id: e for e in examples}
        self.ctx = ExecContext(policy, ToolContext(spec.sandbox), seed=spec.seed,
                               concurrency=spec.concurrency)
        self.evaluator = evaluator or LocalEvaluator(self.ctx, spec.task.reward)
        self.tools = sorted(set(known_tools()) | set(spec.task.tools))
        self.operators = [(get_operator(o.name), o.weight) for o in spec.evolve.operators]
        self.select = get_selector(spec.evolve.selection.kind)
        self.operator_policy = get_policy(spec.evolve.operator_policy.kind)
        self._spent_before = archive.usage()  # a resumed run's budget goes on from here
        self._novelty: NoveltyIndex | None = None  # built from the archive when first needed
        self.insights = [Insight(t, v) for t, v in (archive.insights() or memory)]
        self.level = archive.meta(LEVEL_KEY) or 0  # the curriculum's (rl/curriculum.py)
        if self.level:
            self.splits["train"] = self._train_at(self.level)

    # -- the loop ------------------------------------------------------------------------------
    async def run(self) -> SearchResult:
        """Seed (or resume), run the remaining generations, then score the best on test once."""
        last = self.archive.last_generation()
        if last is None:
            self.archive.start_run(self.spec.name, self.spec.model_dump_json())
            await self._seed()
            last = (0, 0)
        else:
            self.reporter.log(f"resuming after generation {last[0]} (weights v{last[1]})")
            if last[1] > 0:
                self._restore(last[1])
        gen, version = last
        await self._serve(version)
        self._progress(gen, version)
        while gen < self.spec.evolve.generations and not self._budget_spent(gen):
            gen += 1
            version = await self._generation(gen, version)
        return await self._finish(gen, version)

    def usage(self) -> tuple[int, int]:
        """(completions, tokens) the policy and mutator models generated in this run so far
        (with the evaluator's, when it has backends of its own: Ray workers)."""
        now, far = total_usage([self.policy, self.mutator]), self.evaluator.usage()
        calls, tokens = self._spent_before
        return calls + now.calls + far.calls, tokens + now.tokens + far.tokens

    def _budget_spent(self, gen: int) -> bool:
        cap = self.spec.evolve.max_calls
        calls = self.usage()[0]
        if cap is None or calls < cap:
            return False
        self.reporter.log(f"budget spent: {calls} model calls >= evolve.max_calls {cap}; "
                          f"the search stops after generation {gen}")
        return True

    async def _serve(self, version: int) -> None:
        """Name the policy's weights ``version`` and hand trained ones to the evaluator."""
        self.policy.weights_version = version
        if version > 0 and self.rl is not None:
            await self.evaluator.sync(self.rl.weights(), version)

    def _restore(self, version: int) -> None:
        rows = [r for r in self.archive.checkpoints() if r["weights_version"] == version]
        if self.rl is None or not rows:
            raise EvoagentError(f"the archive is at weights v{version} but its checkpoint is missing")
        self.rl.restore(rows[0]["path"], version)

    async def _seed(self) -> None:
        pending = _Pending(0, 0)
        val = self.splits["val"]
        graphs = [load_graph(self.spec.resolve(p)) for p in self.spec.graphs]
        self.reporter.stage("seeds", len(graphs) * len(val))
        seen: set[str] = set()
        for i, g in enumerate(graphs):
            validate(g, self.tools)
            if g.id in seen:
                continue
            seen.add(g.id)
            pending.agents.append(AgentRecord(g.id, g, (), "seed", 0, i % self.spec.evolve.selection.islands, "ok", None))
        pending.insights = list(self.insights) if self.insights else None  # --memory, kept
        evs = await asyncio.gather(*(self._full(a.graph, val) for a in pending.agents))
        for a, ev in zip(pending.agents, evs, strict=True):
            self._record(pending, a.id, "val", "full", ev)
            self.reporter.log(f"seed {a.graph.name} [{a.id}] val {ev.score:.3f}")
        self.archive.commit_generation(pending.write(usage=self.usage()))

    async def _full(self, graph: AgentGraph, examples: Sequence[Example]) -> Evaluation:
        return await self.evaluator.evaluate(graph, examples, self.reporter.advance)

    def _record(self, pending: _Pending, agent_id: str, split_: str, stage: str, ev: Evaluation) -> None:
        pending.add_eval(agent_id, split_, stage, ev)
        pending.trajectories.extend((split_, t, ev.weights_version) for t in ev.trajectories)

    def _pool(self, version: int) -> Pool:
        """The selection pool, with what pareto and map_elites read from the archive on demand."""
        cands = self._candidates(version)

        def instances() -> dict[str, dict[str, float]]:
            out: dict[str, dict[str, float]] = {}
            for v in {c.version for c in cands}:  # each agent's rewards under its own version
                out.update(instance_scores(self.archive, [c.id for c in cands if c.version == v], v))
            return out

        return Pool(cands, instances, lambda name, ids: get_descriptor(name)(self.archive, ids))

    def _candidates(self, version: int) -> list[Candidate]:
        """Every valid agent with a full val score, its latest up to ``version`` (one SQL query,
        no graphs): an RL phase re-scores only the top agents, and the rest stay selectable."""
        return [Candidate(*row) for row in self.archive.candidates("val", version)]

    async def _generation(self, gen: int, version: int) -> int:
        cfg = self.spec.evolve
        pending = _Pending(gen, version)
        pool = self._pool(version)
        if not len(pool):
            raise EvoagentError("no valid scored agent to evolve from (all seeds failed?)")
        known = self.archive.known_ids()
        rngs = [random.Random(request_seed(self.spec.seed, "child", gen, s)) for s in range(cfg.children)]
        choose = self.operator_policy(self.operators, operator_outcomes(self.archive), gen, cfg.operator_policy)
        made = await asyncio.gather(*(
            self._child(gen, s, pool, rngs[s], known, pending, choose) for s in range(cfg.children)
        ))
        children: list[tuple[AgentRecord, AgentGraph]] = []
        for slot, rec in enumerate(made):
            if rec.id in known:  # an earlier slot of this generation built the same child
                rec = await self._child(gen, slot, pool, rngs[slot], known, pending, choose)
            if rec.id in known:
                self.reporter.log(f"gen {gen}: {rec.operator} rebuilt existing agent {rec.id}; skipped")
                continue
            rec = self._novel_or_duplicate(rec)  # against the earlier slots too
            if rec.status == "ok" and self._novelty is not None:
                self._novelty.add(rec.id, rec.graph)  # type: ignore[arg-type]
            known.add(rec.id)
            pending.agents.append(rec)
            if rec.status == "ok" and rec.graph is not None:
                children.append((rec, rec.graph))
            else:
                self.reporter.log(f"gen {gen}: {rec.operator} -> {rec.status}: {rec.reason}")
        self._record_rescored(gen, pool, pending)
        await self._evaluate(gen, version, children, pending)
        if cfg.memory.enabled:
            await self._learn_insights(gen, pending)
        checkpoint = None
        if self.rl is not None and self.spec.rl.enabled and gen % self.spec.rl.every == 0:
            checkpoint, version = await self._rl_phase(pending, gen, version)
        self.archive.commit_generation(pending.write(checkpoint, self.usage()))
        self._progress(gen, version)
        return version

    async def _evaluate(
        self, gen: int, version: int, children: list[tuple[AgentRecord, AgentGraph]], pending: _Pending
    ) -> None:
        """Cascade-evaluate the children into ``pending``; a child the backend failed on is
        archived as crashed, and a generation the backend left with nothing raises."""
        cfg = self.spec.evolve
        val = self.splits["val"]
        self.reporter.stage(f"gen {gen}: evaluate {len(children)} children", len(children) * len(val))
        results = await asyncio.gather(*(
            cascade(g, val, self.evaluator, cfg.cascade, on_done=self.reporter.advance)
            for _, g in children
        ), return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException) and not isinstance(res, BackendError):
                raise res
        failed = [r for r in results if isinstance(r, BackendError)]
        mutator_failed = [
            a for a in pending.agents if (a.reason or "").startswith((MUTATOR_FAILED, RESCORE_FAILED))
        ]
        if (failed or mutator_failed) and len(failed) == len(results):  # nothing was evaluated
            cause = failed[0] if failed else mutator_failed[0].reason
            raise BackendError(f"generation {gen} could not proceed: {cause}")
        for (rec, _), res in zip(children, results, strict=True):
            if isinstance(res, BackendError):
                crashed = replace(rec, status="crashed", reason=f"the backend failed while evaluating it: {res}")
                pending.agents[pending.agents.index(rec)] = crashed
                self.reporter.log(f"gen {gen}: {rec.operator} -> {rec.id} crashed: {crashed.reason}")
                continue
            assert not isinstance(res, BaseException)
            self._record(pending, rec.id, "val", "minibatch", res.minibatch)
            if res.full is not None:
                pending.add_eval(rec.id, "val", "full", res.full)
                done = {t.input_id for t in res.minibatch.trajectories}
                pending.trajectories.extend(
                    ("val", t, version) for t in res.full.trajectories if t.input_id not in done
                )
            score = f"val {res.full.score:.3f}" if res.full else f"minibatch {res.minibatch.score:.3f} (stopped)"
            self.reporter.log(f"gen {gen}: {rec.operator} {rec.parents} -> {rec.id} {score}")

    async def _learn_insights(self, gen: int, pending: _Pending) -> None:
        """ExpeL: update the insight memory from this generation's (success, failure) pairs."""
        cfg = self.spec.evolve.memory
        fresh = [t for split_, t, _ in pending.trajectories if split_ == "val"]
        inputs = sorted({t.input_id for t in fresh})
        archived = self.archive.trajectories_of_inputs("val", inputs) if inputs else []
        pairs = contrast_pairs(fresh, archived, cfg.pairs)
        if not pairs:
            return
        shown = [(self._feedback(good), self._feedback(bad)) for good, bad in pairs]
        try:
            learned = await learn(self.insights, shown, self.mutator, self.spec.task.description,
                                  cfg.max_insights, request_seed(self.spec.seed, "insights", gen))
        except BackendError as e:  # the memory waits for the next generation
            self.reporter.log(f"gen {gen}: insights not updated: the mutator failed: {e}")
            return
        if learned != self.insights:
            self.insights = pending.insights = learned
            self.reporter.log(f"gen {gen}: insight memory now holds {len(learned)} rule(s)")

    def _progress(self, gen: int, version: int) -> None:
        """One line per committed generation: where the search stands and what it has cost."""
        best = self.archive.best("val", version)
        calls, tokens = self.archive.cost()
        top = f"{best[1]:.3f} ({best[0].id})" if best else "-"
        summary = f"best val {top} under weights v{version}; {calls} executions, {tokens} tokens"
        self.reporter.search(gen, self.spec.evolve.generations, summary)
        self.reporter.log(f"gen {gen}/{self.spec.evolve.generations} done: {summary} so far")

    async def _child(
        self, gen: int, slot: int, pool: Pool, rng: random.Random, known: set[str], pending: _Pending,
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
        self, gen: int, slot: int, pool: Pool, rng: random.Random, pending: _Pending, choose: Choose
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
        ctx = self._mutation_context(seen, rng, pool)
        try:
            child = await op.apply([self.archive.graph(p.id) for p in parents], ctx,
                                   self.ctx.user, self.spec.evolve.operator_timeout_s)
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

    async def _current_executions(self, parent: Candidate, pending: _Pending) -> list[Trajectory]:
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

    def _record_rescored(self, gen: int, pool: Pool, pending: _Pending) -> None:
        """Archive the parents re-scored this generation, in id order (reruns write alike)."""
        before = {c.id: c for c in pool.candidates}
        for pid in sorted(pending.rescored):
            task = pending.rescored[pid]
            if task.exception() is not None:  # its children are archived as crashed
                continue
            ev = task.result()
            self._record(pending, pid, "val", "full", ev)
            old = before[pid]
            self.reporter.log(f"gen {gen}: parent {pid} val {old.score:.3f} (v{old.version}) -> "
                              f"{ev.score:.3f} (v{ev.weights_version})")

    def _mutation_context(
        self, executions: Sequence[Trajectory], rng: random.Random, pool: Pool
    ) -> MutationContext:
        cfg = self.spec.evolve
        version = self.policy.weights_version
        feedback = [self._feedback(t) for t in executions]
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
            insights=tuple(i.text for i in self.insights[: cfg.memory.top_k]),
            history=lambda: self._trials(pool, version),
            evaluate=lambda graph, n: self._rewards_on_train(graph, n, rng),
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
        stopped = [(a.graph, s) for a, s in self.archive.stopped("val", version) if a.graph]
        return scored + stopped

    def _feedback(self, t: Trajectory) -> Feedback:
        ex = self.by_id.get(t.input_id)
        return Feedback.of(t, ex.answer if ex else "?")

    async def _rl_phase(self, pending: _Pending, gen: int, version: int) -> tuple[tuple[str, dict], int]:
        """Train on the elite's rollouts, bump the weights version, re-score the top agents."""
        assert self.rl is not None
        fresh = {e.agent_id: e.score for e in pending.evaluations if e.split == "val" and e.stage == "full"}
        graphs = {a.id: a.graph for a in pending.agents if a.id in fresh and a.graph is not None}
        children = [Candidate(a, fresh[a], 0, 0, gen, version) for a in graphs]  # not yet committed
        archived = [  # parents re-scored this generation rank by their new score
            replace(c, score=fresh[c.id], version=version) if c.id in fresh else c
            for c in self._candidates(version)
        ]
        pool = sorted(archived + children, key=lambda c: (-c.score, c.generation, c.id))
        graph = lambda c: graphs.get(c.id) or self.archive.graph(c.id)  # noqa: E731
        n = self.spec.rl.elite
        elite = [graph(c) for c in pool[:n]]
        reserve = [graph(c) for c in pool[n : n + self.spec.rl.spread_agents]]
        self.reporter.stage(f"gen {gen}: RL on {len(elite)} elite agent(s)", self.spec.rl.steps)
        res = await self.rl.train(elite, self.splits["train"], gen, self.reporter.advance, reserve)
        if res.archive:
            pending.trajectories.extend(("train", t, version) for t in res.rollouts)
        path, metrics = res.checkpoint, res.metrics
        skipped = ", ".join(
            f"{int(sum(s.get(f'skipped_{why}', 0) for s in metrics['per_step']))} ({meaning})"
            for why, meaning in SKIPS.items()
        )
        self.reporter.log(
            f"gen {gen}: RL trained {int(metrics['steps_trained'])}/{self.spec.rl.steps} steps, "
            f"rollout reward {metrics['reward_mean']:.3f}, samples skipped: {skipped}"
        )
        self._promote(gen, metrics.get("accuracy", 0.0), pending)
        version += 1
        await self._serve(version)
        pending.version = version
        top = pool[: max(self.spec.rl.elite, self.spec.evolve.selection.islands * 2)]
        self.reporter.stage(f"gen {gen}: re-evaluate {len(top)} under weights v{version}",
                            len(top) * len(self.splits["val"]))
        evs = await asyncio.gather(*(self._full(graph(c), self.splits["val"]) for c in top))
        for c, ev in zip(top, evs, strict=True):
            self._record(pending, c.id, "val", "full", ev)
            self.reporter.log(f"gen {gen}: {c.id} val {c.score:.3f} (v{c.version}) -> {ev.score:.3f} (v{version})")
        return (path, metrics), version

    def _promote(self, gen: int, accuracy: float, pending: _Pending) -> None:
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
        return train_at(level, spec.task.dataset, spec.rl.curriculum, spec.task.splits.train, spec.seed,
                        Path(spec.base_dir))

    async def _finish(self, gen: int, version: int) -> SearchResult:
        best = self.archive.best("val", version)
        if best is None:
            raise EvoagentError("no agent has a full val score")
        agent, score = best
        calls, tokens = self.usage()  # the search's cost; the test below is outside the budget
        test = self.archive.score(agent.id, "test", version)
        if test is None and self.splits["test"]:
            self.reporter.stage(f"test: best agent {agent.id}", len(self.splits["test"]))
            ev = await self._full(agent.graph, self.splits["test"])
            pending = _Pending(gen, version)
            self._record(pending, agent.id, "test", "full", ev)
            self.archive.commit_generation(pending.write())
            test = ev.score
        seeds = [self.archive.score(a.id, "val", 0) for a in self.archive.agents(operator="seed")]
        return SearchResult(
            run_dir=self.archive.run_dir,
            best_id=agent.id,
            best_val=score,
            seed_val=max((s for s in seeds if s is not None), default=0.0),
            test=test,
            weights_version=version,
            generations=gen,
            calls=calls,
            tokens=tokens,
        )


def _failed(gen: int, slot: int, base: dict, status: str, reason: str) -> AgentRecord:
    """The archive row of a child that never became a runnable graph; its id names the slot."""
    return AgentRecord(id=f"x{gen:03d}-{slot:03d}", graph=None, status=status, reason=reason, **base)
