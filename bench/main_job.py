"""Measure the README's main job: ``evoagent run examples/arithmetic/task.yaml`` on the embedded
SmolLM2-135M-Instruct, end to end, on this machine, beside the same run without RL.

Two arms, each in its own process (so each peak RSS is its own), at the same seed: ``joint``
(the task as written: evolution and RL phases) and ``evolve`` (the same spec with
``rl.enabled: false``), so the figures say what the weights add. The baseline of each arm is
the search's own starting point, measured in the same run: the best seed graph's val score.
Prints and writes per arm the best val and its ratio over the seed, the test score of the final
best agent, wall-clock time, peak RSS and the evaluation cost (agent executions and generated
tokens, RL rollouts excluded), plus joint - evolve; writes ``bench/results/main_job.json`` (for
another task: ``main_job_<task name>.json``).

    python bench/main_job.py [--task examples/arithmetic/task.yaml] [--arms joint,evolve]
                             [--mutator embedded:qwen2.5-coder-1.5b] [--operator-policy fixed]

With ``--mutator`` both arms use that mutator model, with ``--operator-policy`` that operator
policy; the file's name then says so (``main_job_mutator_qwen2.5-coder-1.5b.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import write_results  # bench/ is sys.path[0] when a script runs

from evoagent import runner
from evoagent.evolve.hooks import NullReporter

ROOT = Path(__file__).resolve().parents[1]
ARM_MARK = "ARM-RESULT "  # the line a child process reports its arm on


class PrintLog(NullReporter):
    """Prints the search's log lines (no progress bars: the output goes to a log file) and
    records when each generation was committed and what it stood at."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.curve: list[dict[str, object]] = []

    def search(self, generation: int, total: int, summary: str) -> None:
        self.curve.append(
            {
                "generation": generation,
                "minutes": round((time.perf_counter() - self.start) / 60, 2),
                "summary": summary,
            }
        )

    def stage(self, name: str, total: int) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)

    def advance(self) -> None: ...

    def log(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_arm(task: str, arm: str, mutator: str, operators: str) -> dict[str, object]:
    """One arm in this process: the search (with ``mutator`` as its mutator model and
    ``operators`` as its operator policy, where given), then its figures."""
    from evoagent.archive.store import Archive
    from evoagent.spec.config import RunSpec

    out = Path(tempfile.mkdtemp(prefix="evoagent-bench-"))
    try:
        d = runner.prepare(task, output=str(out)).model_dump(mode="json")
        if arm == "evolve":
            d["rl"]["enabled"] = False
        if mutator:
            d["mutator"] = {**d["policy"], "model": mutator}
        if operators:
            d["evolve"]["operator_policy"]["kind"] = operators
        spec = RunSpec.model_validate(d)
        start = time.perf_counter()
        log = PrintLog()
        result = asyncio.run(runner.run(spec, log))
        seconds = time.perf_counter() - start
        with Archive(result.run_dir, write=False) as archive:
            executions, tokens = archive.cost()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    ratio = result.best_val / result.seed_val if result.seed_val > 0 else None
    return {
        "seed_val": result.seed_val,
        "best_val": result.best_val,
        "val_gain_ratio": ratio,
        "test": result.test,
        "best_id": result.best_id,
        "weights_version": result.weights_version,
        "generations": result.generations,
        "executions": executions,
        "tokens": tokens,
        "wall_s": round(seconds, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "generations_committed": log.curve,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default=str(ROOT / "examples" / "arithmetic" / "task.yaml"))
    ap.add_argument("--arms", default="joint,evolve", help="comma-separated: joint, evolve")
    ap.add_argument(
        "--mutator",
        default="",
        help="a mutator model for both arms (e.g. embedded:qwen2.5-coder-1.5b)",
    )
    ap.add_argument(
        "--operator-policy",
        default="",
        help="override evolve.operator_policy.kind (fixed, adaptive)",
    )
    ap.add_argument("--arm", help=argparse.SUPPRESS)  # internal: run one arm, print its JSON
    args = ap.parse_args()
    if args.arm:
        print(
            ARM_MARK + json.dumps(run_arm(args.task, args.arm, args.mutator, args.operator_policy)),
            flush=True,
        )
        return
    arms: dict[str, dict[str, object]] = {}
    for arm in args.arms.split(","):
        print(f"== arm {arm}", flush=True)
        cmd = [
            sys.executable,
            __file__,
            "--task",
            args.task,
            "--arm",
            arm,
            "--mutator",
            args.mutator,
            "--operator-policy",
            args.operator_policy,
        ]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        lines = proc.stdout.splitlines()
        print("\n".join(line for line in lines if not line.startswith(ARM_MARK)), flush=True)
        arms[arm] = json.loads(
            next(line for line in lines if line.startswith(ARM_MARK))[len(ARM_MARK) :]
        )
        a = arms[arm]
        print(
            f"{arm}: best seed val {a['seed_val']:.3f} -> best val {a['best_val']:.3f}, test "
            f"{a['test']}, {a['executions']} executions, {float(a['wall_s']) / 60:.1f} min, "
            f"peak RSS {a['peak_rss_mb']} MB",
            flush=True,
        )
    task = Path(args.task).resolve()
    figures: dict[str, object] = {
        "task": str(task.relative_to(ROOT)),
        "command": "python bench/main_job.py " + " ".join(sys.argv[1:]),
        "mutator": args.mutator or "the task's",
        "operator_policy": args.operator_policy or "the task's",
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "arms": arms,
    }
    if {"joint", "evolve"} <= arms.keys():
        j, e = arms["joint"], arms["evolve"]
        figures["joint_minus_evolve"] = {
            "val": float(j["best_val"]) - float(e["best_val"]),  # type: ignore[arg-type]
            "test": None
            if j["test"] is None or e["test"] is None
            else float(j["test"]) - float(e["test"]),  # type: ignore[arg-type]
        }
        print(f"joint - evolve: {figures['joint_minus_evolve']}")
    name = (
        "main_job"
        if task == ROOT / "examples" / "arithmetic" / "task.yaml"
        else f"main_job_{task.parent.name}"
    )
    name += f"_mutator_{args.mutator.removeprefix('embedded:')}" if args.mutator else ""
    name += f"_operators_{args.operator_policy}" if args.operator_policy else ""
    write_results(name, figures, inputs=(task.parent, ROOT / "graphs"))


if __name__ == "__main__":
    main()
