"""Measure the README's main job: ``evoagent run examples/arithmetic/task.yaml`` on the embedded
SmolLM2-135M-Instruct, end to end, on this machine.

The baseline is the search's own starting point, measured in the same run: the best seed
graph's val score. Prints the val gain of the best evolved agent as a ratio over it, the test
score of that agent, the wall-clock time and the peak RSS; writes them to
``bench/results/main_job.json``.

    python bench/main_job.py [--task examples/arithmetic/task.yaml]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import shutil
import tempfile
import time
from pathlib import Path

from results_io import write_results  # bench/ is sys.path[0] when a script runs

from evoagent import runner
from evoagent.evolve.hooks import NullReporter

ROOT = Path(__file__).resolve().parents[1]


class PrintLog(NullReporter):
    """Prints the search's log lines (no progress bars: the output goes to a log file) and
    records when each generation was committed and what it stood at."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.curve: list[dict[str, object]] = []

    def search(self, generation: int, total: int, summary: str) -> None:
        self.curve.append({"generation": generation, "minutes": round((time.perf_counter() - self.start) / 60, 2),
                           "summary": summary})

    def stage(self, name: str, total: int) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)

    def advance(self) -> None: ...

    def log(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default=str(ROOT / "examples" / "arithmetic" / "task.yaml"))
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="evoagent-bench-"))
    try:
        spec = runner.prepare(args.task, output=str(out))
        start = time.perf_counter()
        log = PrintLog()
        result = asyncio.run(runner.run(spec, log))
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(out, ignore_errors=True)
    ratio = result.best_val / result.seed_val if result.seed_val > 0 else float("inf")
    figures = {
        "task": str(Path(args.task).resolve().relative_to(ROOT)),
        "seed_val": result.seed_val,
        "best_val": result.best_val,
        "val_gain_ratio": ratio,
        "test": result.test,
        "best_id": result.best_id,
        "weights_version": result.weights_version,
        "generations": result.generations,
        "wall_s": round(seconds, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "generations_committed": log.curve,
    }
    print(f"best seed val {result.seed_val:.3f} -> best evolved val {result.best_val:.3f} "
          f"(ratio {ratio:.1f}x), test {result.test}, {seconds / 60:.1f} min, "
          f"peak RSS {figures['peak_rss_mb']} MB")
    write_results("main_job", figures)


if __name__ == "__main__":
    main()
