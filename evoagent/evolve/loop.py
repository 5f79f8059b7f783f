"""The outer loop: seed, then per generation select, mutate, validate, cascade-evaluate, archive;
after a generation, when ``rl.schedule`` says so, an RL phase (``rl_turn.py``) trains the policy
on the elite's rollouts. A phase is never the last step (the run ends on a search generation under the final
weights), and a phase that lowered the best agent's val beyond the noise is rolled back.

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
from dataclasses import replace
from pathlib import Path

from evoagent.archive.records import AgentRecord
from evoagent.archive.store import Archive
from evoagent.errors import BackendError, EvoagentError
from evoagent.evolve.breeding import (
    MUTATOR_FAILED,
    RESCORE_FAILED,
    Breeder,
    selection_pool,
)
from evoagent.evolve.cascade import cascade
from evoagent.evolve.hooks import NullReporter, Reporter, RLHook, SearchResult
from evoagent.evolve.insights import Insight, contrast_pairs, learn
from evoagent.evolve.pending import Pending
from evoagent.evolve.rl_turn import RLTurn
from evoagent.execute.evaluate import Evaluation, Evaluator, LocalEvaluator
from evoagent.execute.executor import ExecContext, request_seed
from evoagent.graph import AgentGraph, load_graph, validate
from evoagent.llm.backend import Backend, total_usage
from evoagent.rl.schedule import (
    RL,
    SEARCH,
    STEPS_KEY,
    Step,
    recorded,
)
from evoagent.spec.config import RunSpec
from evoagent.tasks.datasets import Example, task_data
from evoagent.tools import ToolContext


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
        examples, self.splits = task_data(spec.task, spec.seed, Path(spec.base_dir))
        self.by_id = {e.id: e for e in examples}
        self.ctx = ExecContext(policy, ToolContext(spec.sandbox), seed=spec.seed,
                               concurrency=spec.concurrency, node_adapters=spec.rl.per_node)
        self.evaluator = evaluator or LocalEvaluator(self.ctx, spec.task.reward)
        self.breeder = Breeder(spec, archive, self.evaluator, mutator, self.ctx.user, self.splits, self.by_id,
                               lambda: [i.text for i in self.insights], lambda: self.policy.weights_version,
                               self.reporter.log)
        self._spent_before = archive.usage()  # a resumed run's budget goes on from here
        self.insights = [Insight(t, v) for t, v in (archive.insights() or memory)]
        self.turn = RLTurn(spec, archive, rl, self.evaluator, policy, self.reporter, self.splits,
                           self._serve, self._requests)
        self.steps = recorded(archive)

    @property
    def rl(self) -> RLHook | None:
        """The inner RL loop, if any (``attach_rl``, or the constructor's ``rl``)."""
        return self.turn.rl

    def attach_rl(self, rl: RLHook) -> None:
        """Give the search its RL loop after construction (``RLPhase`` needs ``self.ctx``)."""
        self.turn.attach(rl)

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

    def _requests(self) -> int:
        """Completions asked of the models so far in this process, cache hits included: what a
        step costs as ``rl.schedule`` counts it, the same whether or not the run was resumed."""
        return total_usage([self.policy, self.mutator]).requests + self.evaluator.usage().requests

    def _budget_spent(self, gen: int) -> bool:
        cap = self.spec.evolve.max_calls
        calls = self.usage()[0]
        if cap is None or calls < cap:
            return False
        if self.steps and self.steps[-1].kind == RL and self.spec.evolve.children > 0:
            self.reporter.log(f"budget spent: {calls} model calls >= evolve.max_calls {cap}, but "
                              f"generation {gen} ended on an RL phase: one more search generation "
                              "runs under its weights, so the run ends on the program")
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
        pending = Pending(0, 0)
        val = self.splits["val"]
        graphs = [load_graph(self.spec.resolve(p)) for p in self.spec.graphs]
        self.reporter.stage("seeds", len(graphs) * len(val))
        seen: set[str] = set()
        for i, g in enumerate(graphs):
            validate(g, self.breeder.tools)
            if g.id in seen:
                continue
            seen.add(g.id)
            pending.agents.append(AgentRecord(g.id, g, (), "seed", 0, i % self.spec.evolve.selection.islands, "ok", None))
        pending.insights = list(self.insights) if self.insights else None  # --memory, kept
        evs = await asyncio.gather(*(self._full(a.graph, val) for a in pending.agents))
        for a, ev in zip(pending.agents, evs, strict=True):
            pending.record(a.id, "val", "full", ev)
            self.reporter.log(f"seed {a.graph.name} [{a.id}] val {ev.score:.3f}")
        self.archive.commit_generation(pending.write(usage=self.usage()))

    async def _full(self, graph: AgentGraph, examples: Sequence[Example]) -> Evaluation:
        return await self.evaluator.evaluate(graph, examples, self.reporter.advance)

    async def _generation(self, gen: int, version: int) -> int:
        pending = Pending(gen, version)
        pool = selection_pool(self.archive, version)
        if not len(pool):
            raise EvoagentError("no valid scored agent to evolve from (all seeds failed?)")
        asked, best = self._requests(), self._best_val(version)
        children = await self.breeder.breed(gen, pool, pending)
        await self._evaluate(gen, version, children, pending)
        if self.spec.evolve.memory.enabled:
            await self._learn_insights(gen, pending)
        self.steps.append(Step(gen, SEARCH, self._requests() - asked, self._best_val(version, pending) - best))
        checkpoint = None
        if self.turn.due(gen, self.steps, pending, self.usage()[0]):
            checkpoint, version, step = await self.turn.run(pending, gen, version)
            self.steps.append(step)
        pending.meta[STEPS_KEY] = [s.to_json() for s in self.steps]
        self.archive.commit_generation(pending.write(checkpoint, self.usage()))
        self._progress(gen, version)
        return version

    def _best_val(self, version: int, pending: Pending | None = None) -> float:
        """The best full val score under ``version``: the archive's, or this generation's."""
        best = self.archive.best("val", version)
        fresh = [e.score for e in (pending.evaluations if pending else [])
                 if e.split == "val" and e.stage == "full" and e.weights_version == version]
        return max([best[1] if best else 0.0, *fresh])

    async def _evaluate(
        self, gen: int, version: int, children: list[tuple[AgentRecord, AgentGraph]], pending: Pending
    ) -> None:
        """Cascade-evaluate the children into ``pending``; a child the backend failed on is
        archived as crashed, and a generation the backend left with nothing raises."""
        cfg = self.spec.evolve
        val = self.splits["val"]
        screen = self._screen(gen)
        self.reporter.stage(f"gen {gen}: evaluate {len(children)} children",
                            len(children) * (len(val) + len(screen)))
        results = await asyncio.gather(*(
            cascade(g, val, self.evaluator, cfg.cascade, self.reporter.advance, screen)
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
            pending.record(rec.id, cfg.cascade.first_stage, "minibatch", res.minibatch)
            if res.full is not None:
                pending.add_eval(rec.id, "val", "full", res.full)
                done = {t.input_id for t in res.minibatch.trajectories} if not screen else set()
                pending.trajectories.extend(
                    ("val", t, version) for t in res.full.trajectories if t.input_id not in done
                )
            score = f"val {res.full.score:.3f}" if res.full else f"minibatch {res.minibatch.score:.3f} (stopped)"
            self.reporter.log(f"gen {gen}: {rec.operator} {rec.parents} -> {rec.id} {score}")

    def _screen(self, gen: int) -> list[Example]:
        """With ``cascade.first_stage: train``, the generation's screening inputs: a seeded draw
        from the train split, so over generations the search's episodes cover it."""
        cfg = self.spec.evolve.cascade
        if cfg.first_stage != "train":
            return []
        train = self.splits["train"]
        rng = random.Random(request_seed(self.spec.seed, "screen", gen))
        return rng.sample(list(train), min(cfg.minibatch, len(train)))

    async def _learn_insights(self, gen: int, pending: Pending) -> None:
        """ExpeL: update the insight memory from this generation's (success, failure) pairs."""
        cfg = self.spec.evolve.memory
        fresh = [t for split_, t, _ in pending.trajectories if split_ == "val"]
        inputs = sorted({t.input_id for t in fresh})
        archived = self.archive.trajectories_of_inputs("val", inputs) if inputs else []
        pairs = contrast_pairs(fresh, archived, cfg.pairs)
        if not pairs:
            return
        shown = [(self.breeder.feedback(good), self.breeder.feedback(bad)) for good, bad in pairs]
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
            pending = Pending(gen, version)
            pending.record(agent.id, "test", "full", ev)
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
