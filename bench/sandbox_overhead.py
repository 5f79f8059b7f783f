"""Start-up cost of one sandboxed Python call against a bare subprocess, measured in one run.

HumanEval-style tasks run thousands of short programs, so the sandbox's fixed cost per call
matters. Each round runs ``print(1)`` once per variant, in an interleaved order so that noise on
this shared machine hits every variant alike; the figure is the median seconds per call.

- baseline: ``python -I main.py`` as a plain subprocess (no limits, no isolation);
- rlimits-only: ``evoagent.tools.run_python`` with rlimits, cgroup, scratch folder, timeout;
- bwrap: the same plus bubblewrap's namespaces (the default mode).

Prints each variant's median and its ratio to the baseline (goal: bwrap under 2x) and writes
them to ``bench/results/sandbox_overhead.json``.

    python bench/sandbox_overhead.py [--calls 40]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from results_io import write_results  # bench/ is sys.path[0] when a script runs

from evoagent.tools import SandboxConfig, run_python


async def bare(code: str) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="evoagent-bare-"))
    try:
        (scratch / "main.py").write_text(code)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "main.py", cwd=scratch,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
        assert out.strip() == b"1", out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def sandboxed(code: str, mode: str) -> None:
    result = await run_python(code, SandboxConfig(mode=mode))  # type: ignore[arg-type]
    assert result.ok and result.stdout.strip() == "1", result


async def main(calls: int) -> dict[str, object]:
    variants = {"baseline": bare}
    variants["rlimits-only"] = lambda c: sandboxed(c, "rlimits-only")
    if shutil.which("bwrap"):
        variants["bwrap"] = lambda c: sandboxed(c, "bwrap")
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name, fn in variants.items():  # warm-up: page cache, first cgroup, bwrap binary
        await fn("print(1)")
    for _ in range(calls):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            await fn("print(1)")
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["baseline"])
    figures: dict[str, object] = {"calls": calls}
    for name, ts in times.items():
        med = statistics.median(ts)
        figures[f"{name}_ms"] = round(med * 1000, 2)
        if name != "baseline":
            figures[f"{name}_ratio"] = round(med / base, 3)
        ratio = f"  {med / base:.2f}x baseline" if name != "baseline" else ""
        print(f"{name:>13}: {med * 1000:7.1f} ms per call (median of {len(ts)}){ratio}")
    return figures


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=40)
    figures = asyncio.run(main(ap.parse_args().calls))
    write_results("sandbox_overhead", figures)
