"""Score a task's seed agents on its val and test splits: where the search and RL start.

A task gives a learning signal only if its seeds score somewhere between 0 and 1 (a GRPO
group whose samples all score 0 has no gradient); this measures it on the embedded model (or
the task's own policy) and writes ``bench/results/seed_scores_<task name>.json``: per seed
graph, val and test scores, agent executions, generated tokens and seconds. With
``--samples N`` it also draws N executions of each seed per test input at ``--temperature`` and
reports the unbiased pass@1 and pass@N (for agents that sample, e.g. code on HumanEval).

    python bench/seed_scores.py examples/equations/task.yaml [more task files] [--samples 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from pathlib import Path

from results_io import write_results  # bench/ is sys.path[0] when a script runs

from evoagent import runner
from evoagent.execute.evaluate import evaluate, sampled_pass_at_k
from evoagent.execute.executor import ExecContext
from evoagent.graph import load_graph
from evoagent.llm.factory import make_backend
from evoagent.tasks.datasets import task_data
from evoagent.tools import ToolContext

ROOT = Path(__file__).resolve().parents[1]


async def seed_scores(task: str, samples: int, temperature: float) -> dict[str, object]:
    spec = runner.prepare(task, output=tempfile.mkdtemp(prefix="evoagent-bench-"))
    parts = task_data(spec.task, spec.seed, Path(spec.base_dir))[1]
    backend = make_backend(spec.policy)
    ctx = ExecContext(backend, ToolContext(spec.sandbox), seed=spec.seed, concurrency=spec.concurrency)
    seeds: dict[str, dict[str, object]] = {}
    try:
        for path in spec.graphs:
            graph = load_graph(spec.resolve(path))
            row: dict[str, object] = {}
            for name in ("val", "test"):
                start = time.perf_counter()
                ev = await evaluate(graph, parts[name], ctx, spec.task.reward)
                row[name] = {"score": ev.score, "executions": ev.n, "tokens": ev.tokens,
                             "seconds": round(time.perf_counter() - start, 1)}
            if samples > 1:
                ks = (1, samples)
                got = await sampled_pass_at_k(graph, parts["test"], ctx, spec.task.reward, samples, ks, temperature)
                row["test_pass_at_k"] = {"samples": samples, "temperature": temperature,
                                         **{f"pass@{k}": round(v, 4) for k, v in got.items()}}
                print(f"{spec.name}: seed {graph.name}: test {row['test_pass_at_k']}", flush=True)
            seeds[graph.name] = row
            print(f"{spec.name}: seed {graph.name}: val {row['val']['score']:.3f}, "  # type: ignore[index]
                  f"test {row['test']['score']:.3f}", flush=True)  # type: ignore[index]
    finally:
        await backend.aclose()
    return {"name": spec.name, "task": str(Path(task).resolve().relative_to(ROOT)), "policy": spec.policy.model,
            "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores", "seeds": seeds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tasks", nargs="+")
    ap.add_argument("--samples", type=int, default=1, help="executions per test input for pass@k")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature for pass@k")
    args = ap.parse_args()
    for task in args.tasks:
        figures = asyncio.run(seed_scores(task, args.samples, args.temperature))
        write_results(f"seed_scores_{figures['name']}", figures, inputs=(Path(task).parent, ROOT / "graphs"))


if __name__ == "__main__":
    main()
