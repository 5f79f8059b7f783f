"""Does a stronger mutator write better children? The same 32 failing parents, rewritten by the
embedded SmolLM2-135M and by Qwen2.5-Coder-1.5B-Instruct, scored by the same 135M policy.

1. Real archives: each task (``--tasks``, default sums and equations) is searched as its
   task.yaml says, without RL, with the 135M as policy and mutator (the run the project's
   default makes), into a temporary folder.
2. Parents: 16 agents per task, drawn with a fixed seed from the valid agents whose val score
   is below 1, each with its archived failing val executions (at most ``evolve.failures_shown``
   of them, worst first, as the search shows them).
3. Each mutator rewrites every parent once with ``reflective_rewrite`` (GEPA's reflective
   prompt rewrite, the operator whose quality is the mutator's), parent i with the same seeded
   RNG under both mutators, so both rewrite the same node from the same cases; all 32 are asked
   at once (the backend batches them), and the wall clock over 32 is the seconds per child.
4. Every child that parses is scored on the task's whole val split by the 135M policy, in the
   same process as its parent's re-scoring, so the change is measured under equal conditions.

Per mutator: ``parsed`` (the operator returned a child: the reply had an instruction that
differs from the old one), ``novel`` (its id is not in the archive), ``val_change_mean`` (child
minus parent, over the novel children), ``val_change_per_parent`` (the same over all 32, a
failed rewrite counting 0: the parent stays), ``improved`` (share of the 32 whose child beats
its parent), ``seconds_per_child``; each as a ratio to the 135M's (``x_135m``). Writes
``bench/results/mutator_quality.json``.

    python bench/mutator_quality.py [--tasks examples/sums/task.yaml,...] [--mutators embedded,...]
                                    [--work DIR]  # keep the searches; a re-run reuses them
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from baselines import splits_of  # bench/ is sys.path[0] when a script runs
from results_io import write_results

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("examples/sums/task.yaml", "examples/equations/task.yaml")
MUTATORS = ("embedded", "embedded:qwen2.5-coder-1.5b")
PER_TASK = 16
SEED = 0


async def search(task: str, out: Path) -> Any:
    """The task's search as written, RL off, 135M policy and mutator; returns the spec run. A
    search that finished in ``out`` before (``--work``) is reused as it stands: nothing in it
    depends on the mutators under test, so a re-run that only re-times them need not search."""
    from evoagent import runner
    from evoagent.evolve.hooks import NullReporter
    from evoagent.spec import load_spec

    def without_rl(spec: Any) -> Any:
        return spec.model_copy(
            update={"rl": spec.rl.model_copy(update={"enabled": False}), "mutator": None}
        )

    spec = without_rl(load_spec(task).model_copy(update={"output": str(out)}))
    if (spec.run_dir / "result.json").exists():
        print(f"{spec.name}: reusing the finished search in {spec.run_dir}", flush=True)
        return spec
    shutil.rmtree(spec.run_dir, ignore_errors=True)  # a search cut short starts again
    spec = without_rl(runner.prepare(task, output=str(out)))

    class Log(NullReporter):
        def log(self, message: str) -> None:
            print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    await runner.run(spec, Log())
    return spec


def parents_of(spec: Any, rng: random.Random) -> list[dict[str, Any]]:
    """``PER_TASK`` failing agents of the run's archive, with their failures as the search
    shows them to the mutator."""
    from evoagent.archive.store import Archive
    from evoagent.evolve.operators import Feedback

    answers = {e.id: e.answer for part in splits_of(spec).values() for e in part}
    out = []
    with Archive(spec.run_dir, write=False) as archive:
        for a in sorted(archive.agents(status="ok"), key=lambda a: a.id):
            score = archive.score(a.id, "val", 0)
            if score is None or score >= 1.0:
                continue
            runs = {
                t.input_id: t for t in archive.trajectories(a.id, "val", 0)
            }  # the last per input
            fails = sorted(
                (
                    Feedback.of(t, answers.get(t.input_id, "?"))
                    for t in runs.values()
                    if (t.reward or 0.0) < 1.0
                ),
                key=lambda f: f.reward,
            )
            out.append(
                {
                    "id": a.id,
                    "graph": archive.graph(a.id),
                    "val": score,
                    "failures": tuple(fails[: spec.evolve.failures_shown]),
                    "known": archive.known_ids(),
                }
            )
    if len(out) < PER_TASK:
        raise SystemExit(
            f"{spec.name}: its archive holds {len(out)} failing agents, fewer than "
            f"{PER_TASK}; raise the task's evolve.generations"
        )
    return rng.sample(out, PER_TASK)


async def rewrite_all(
    mutator: Any, parents: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], float]:
    """Every parent rewritten once, all at once; (children, wall seconds)."""
    from evoagent.errors import MutationError
    from evoagent.evolve.catalog import get_operator
    from evoagent.evolve.operators import MutationContext

    op = get_operator("reflective_rewrite")

    async def one(i: int, p: dict[str, Any]) -> dict[str, Any]:
        ctx = MutationContext(
            llm=mutator,
            rng=random.Random(1000 + i),
            task=p["spec"].task.description,
            failures=p["failures"],
        )
        try:
            child = await op.apply([p["graph"]], ctx)
        except MutationError as e:
            return {"parsed": False, "reason": str(e)[:300]}
        node = next(n for n in child.nodes if n not in p["graph"].nodes)
        return {
            "parsed": True,
            "graph": child,
            "novel": child.id not in p["known"],
            "node": node.id,
            "system": (node.system or "")[:600],
        }

    t0 = time.perf_counter()
    children = await asyncio.gather(*(one(i, p) for i, p in enumerate(parents)))
    return list(children), time.perf_counter() - t0


async def score_children(
    parents: list[dict[str, Any]], results: dict[str, list[dict[str, Any]]]
) -> None:
    """Val scores of every parent and every novel child, by the 135M policy, in place."""
    from evoagent.execute.evaluate import LocalEvaluator
    from evoagent.execute.executor import ExecContext
    from evoagent.llm.factory import make_backend
    from evoagent.tools import ToolContext

    spec = parents[0]["spec"]
    policy = make_backend(spec.policy)
    try:
        for p in parents:
            spec = p["spec"]
            ctx = ExecContext(
                policy, ToolContext(spec.sandbox), seed=spec.seed, concurrency=spec.concurrency
            )
            evaluator = LocalEvaluator(ctx, spec.task.reward)
            val = splits_of(spec)["val"]
            graphs = [p["graph"]] + [
                r[p["i"]]["graph"] for r in results.values() if r[p["i"]].get("novel")
            ]
            scores = await asyncio.gather(*(evaluator.evaluate(g, val) for g in graphs))
            p["val_now"] = scores[0].score
            for r in results.values():
                c = r[p["i"]]
                if c.get("novel"):
                    c["val"] = scores[[g.id for g in graphs].index(c["graph"].id)].score
                    c["val_change"] = c["val"] - p["val_now"]
            await ctx.user.aclose()
    finally:
        await policy.aclose()


def summary(children: list[dict[str, Any]], wall: float) -> dict[str, float]:
    novel = [c for c in children if c.get("novel")]
    n = len(children)
    return {
        "parsed": round(sum(c["parsed"] for c in children) / n, 3),
        "novel": round(len(novel) / n, 3),
        "val_change_mean": round(statistics.fmean(c["val_change"] for c in novel), 4)
        if novel
        else 0.0,
        "val_change_per_parent": round(sum(c["val_change"] for c in novel) / n, 4),
        "improved": round(sum(c["val_change"] > 0 for c in novel) / n, 3),
        "seconds_per_child": round(wall / n, 2),
        "wall_s": round(wall, 1),
    }


async def main(tasks: list[str], mutators: list[str], keep: Path | None) -> None:
    from evoagent.llm.factory import make_backend
    from evoagent.spec.config import BackendConfig

    rng = random.Random(SEED)
    work = keep or Path(tempfile.mkdtemp(prefix="mutator-quality-"))
    try:
        parents: list[dict[str, Any]] = []
        for task in tasks:
            spec = await search(task, work / Path(task).resolve().parent.name)
            for p in parents_of(spec, rng):
                parents.append(p | {"spec": spec, "task": spec.name, "i": len(parents)})
        results: dict[str, list[dict[str, Any]]] = {}
        walls: dict[str, float] = {}
        for m in mutators:
            cfg = BackendConfig.model_validate(
                parents[0]["spec"].policy.model_dump() | {"model": m}
            )
            backend = make_backend(cfg)
            try:
                results[m], walls[m] = await rewrite_all(backend, parents)
                tokens = backend.usage.tokens
            finally:
                await backend.aclose()
            print(f"{m}: {len(parents)} rewrites in {walls[m]:.0f} s, {tokens} tokens", flush=True)
        await score_children(parents, results)
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    figures: dict[str, Any] = {
        "tasks": [p.removeprefix("examples/") for p in tasks],
        "parents": len(parents),
        "operator": "reflective_rewrite",
        "policy": "embedded",
        "mutators": {},
    }
    base = mutators[0]
    for m in mutators:
        figures["mutators"][m] = summary(results[m], walls[m])
    for m in mutators:
        s, b = figures["mutators"][m], figures["mutators"][base]
        s["x_135m"] = {
            k: (round(s[k] / b[k], 2) if b[k] else None)
            for k in ("parsed", "novel", "seconds_per_child")
        }
    figures["children"] = [
        {
            "task": p["task"],
            "parent": p["id"],
            "parent_val": p["val"],
            "parent_val_now": p["val_now"],
            **{
                m: {k: v for k, v in results[m][p["i"]].items() if k != "graph"}
                | (
                    {"child": results[m][p["i"]]["graph"].id}
                    if "graph" in results[m][p["i"]]
                    else {}
                )
                for m in mutators
            },
        }
        for p in parents
    ]
    for m in mutators:
        print(f"{m}: {figures['mutators'][m]}", flush=True)
    write_results("mutator_quality", figures, inputs=(*((ROOT / t).parent for t in tasks), ROOT / "graphs"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--mutators", default=",".join(MUTATORS), help="the first is the baseline")
    ap.add_argument("--work", type=Path, default=None,
                    help="keep the searched archives in this folder, and reuse the ones a "
                         "run before finished there (default: a temporary folder, removed)")
    a = ap.parse_args()
    asyncio.run(
        main(
            [t.strip() for t in a.tasks.split(",") if t.strip()],
            [m.strip() for m in a.mutators.split(",") if m.strip()],
            a.work,
        )
    )
