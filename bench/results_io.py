"""Where every benchmark script writes its figures: ``bench/results/NAME.json``, each with the
``code`` it ran (the hashes of the script, every module it can reach and its input files), which
``bench/stale.py`` compares with the code as it stands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from code_graph import Tree, manifest

RESULTS = Path(__file__).resolve().parent / "results"
# The code as this benchmark starts (every script imports this module first): what it records
# is what it ran, however the files change while it runs.
STARTED = Tree().snapshot(("evoagent", "bench", "examples", "graphs"))


def write_results(
    name: str,
    figures: dict[str, Any],
    inputs: tuple[Path, ...] = (),
    script: str | None = None,
    dest: Path | None = None,
) -> Path:
    """Write ``figures`` and the code that made them (``script``, by default the running one,
    with what it reaches, and ``inputs``, as they were when it started) as indented JSON to
    ``bench/results/NAME.json`` (or ``dest``), say so, return the path."""
    dest = dest or RESULTS / f"{name}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    code = manifest(Path(script or sys.argv[0]), inputs, STARTED)
    dest.write_text(json.dumps({**figures, "code": code}, indent=2) + "\n")
    print(f"wrote {dest}")
    return dest


def run_marked(cmd: list[str], mark: str, what: str, tail: int = 4000) -> dict[str, Any]:
    """Run a benchmark's child process (one row, one arm); echo the end of its log and return
    the JSON it printed after ``mark``. A child that fails ends the benchmark: nothing is
    written."""
    proc = subprocess.run(
        cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    lines = proc.stdout.splitlines()
    print("\n".join(ln for ln in lines if not ln.startswith(mark))[-tail:], flush=True)
    found = [ln for ln in lines if ln.startswith(mark)]
    if proc.returncode != 0 or not found:
        sys.exit(f"{what} failed (exit {proc.returncode}); nothing was written")
    return json.loads(found[0][len(mark) :])


def run_kept(
    cmd: list[str], mark: str, what: str, key: dict[str, Any], partial: Path, tail: int = 4000
) -> dict[str, Any]:
    """``run_marked``, keeping each finished run in ``partial`` (one JSON line each, keyed by
    ``key``): a long benchmark that is interrupted and started again with the same settings
    skips what it already has. The benchmark removes ``partial`` once it has written its
    results."""
    done = [json.loads(ln) for ln in partial.read_text().splitlines()] if partial.is_file() else []
    for row in done:
        if row["key"] == key:
            print(f"== {what}: kept from {partial.name}", flush=True)
            return row["result"]
    print(f"== {what}", flush=True)
    result = run_marked(cmd, mark, what, tail=tail)
    with partial.open("a") as f:
        f.write(json.dumps({"key": key, "result": result}) + "\n")
    return result
