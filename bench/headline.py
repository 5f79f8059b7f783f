"""The headline: does evolving the program and training the weights together beat each alone,
and beat GEPA and TRL, at the same budget?

Per task (an ``examples/<name>/task.yaml``), six rows on the same policy model, reward and
splits, each in its own process:

1. ``seed``: the best seed agent by val (no search);
2. ``gepa``: GEPA optimizing the seed agent's system texts (``bench/baselines.py``);
3. ``trl_grpo``: TRL's GRPOTrainer on the seed agent's prompts, weights only;
4. ``evolve``: evoagent without RL; 5. ``rl``: evoagent's RL phases without program search
   (``evolve.children: 0``); 6. ``joint``: evoagent as the task is written.

The budget is what the joint row spends, counted in completions the models generated (policy
and mutator; cache hits are free): every other search row gets it (``evolve.max_calls``, GEPA's
stopper, TRL's steps), and each row reports what it spent (``calls``, ``tokens``). GEPA and
TRL also stop at a wall-clock cap (``--gepa-minutes``, ``--trl-minutes``): on a CPU both are
far slower per completion than evoagent's batched rows, and a row stopped early says so by
spending fewer calls than the budget. The test
split is scored once per row; 95% CIs come from a paired bootstrap over the test inputs (the
rows see the same inputs), for each row and for joint minus the best other row. Writes
``bench/results/headline.json`` and ``bench/results/headline.md`` (the README's table) only
when every asked row of every asked task finished; other tasks already in the file are kept.
Each finished row is also kept in ``bench/results/headline.partial.jsonl`` until a run of all
six rows: an interrupted run, or one asked for fewer rows (``--rows seed,joint``), is picked up
by the next without re-running a row, as long as the code, the task and the settings match.

    python bench/headline.py [--tasks examples/chained_ops/task.yaml,...] [--rows seed,joint,...]
    python bench/headline.py --quick     # a tiny random model: checks the wiring, not the numbers
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from results_io import RESULTS, run_kept  # bench/ is sys.path[0] when a script runs

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("seed", "gepa", "trl_grpo", "evolve", "rl", "joint")
SEARCHES = 50  # generations of the budgeted rows: the budget, not this, ends them
ROW_MARK = "ROW-RESULT "
NEEDS = {"gepa": ("gepa", "gepa"), "trl_grpo": ("trl", "trl")}  # row -> (module, pip package)
DEFAULT_TASKS = ("examples/sums/task.yaml", "examples/chained_ops/task.yaml", "examples/equations/task.yaml",
                 "examples/long_chains/task.yaml")
BOOTSTRAP = 5000


# -- one row, in its own process ---------------------------------------------------------------
def spec_for(task: str, row: str, out: str, budget: int | None, model: str | None) -> Any:
    """The task's spec as this row runs it (``model``: a policy folder replacing the task's, and
    the budgets shrunk to a wiring check)."""
    from evoagent import runner
    from evoagent.spec.config import RunSpec

    spec = runner.prepare(task, output=out)
    d = spec.model_dump(mode="json")
    if model is not None:  # --quick
        d["policy"] |= {"model": model, "dtype": "float32", "max_batch": 16}
        d["task"]["dataset"]["size"] = 40
        d["task"]["splits"] = {"train": 4, "val": 4, "test": 4}
        d["evolve"] |= {"generations": 2, "children": 2}
        d["evolve"]["cascade"]["minibatch"] = 2
        d["rl"] |= {"every": 1, "steps": 1, "group_size": 2, "inputs_per_step": 2}
        d["graphs"] = d["graphs"][:1]
    if row == "seed":
        d["evolve"]["generations"] = 0
        d["rl"]["enabled"] = False
    elif row == "evolve":
        d["rl"]["enabled"] = False
        d["evolve"] |= {"generations": SEARCHES, "max_calls": budget}
    elif row == "rl":
        d["rl"] |= {"enabled": True, "every": 1}
        d["evolve"] |= {"generations": SEARCHES, "children": 0, "max_calls": budget}
    return RunSpec.model_validate(d)


def run_search(spec: Any) -> dict[str, Any]:
    """An evoagent row: ``runner.run`` on ``spec``; the figures and the best agent's test rewards."""
    from evoagent import runner
    from evoagent.archive.store import Archive
    from evoagent.evolve.hooks import NullReporter

    class Log(NullReporter):
        def log(self, message: str) -> None:
            print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    start = time.perf_counter()
    result = asyncio.run(runner.run(spec, Log()))
    with Archive(result.run_dir, write=False) as archive:
        tests = list(archive.trajectories(result.best_id, "test", result.weights_version))
        graph = archive.agent(result.best_id).graph
        seeds = {a.graph.name: archive.score(a.id, "val", 0) for a in archive.agents(operator="seed") if a.graph}
    assert graph is not None
    return {
        "test": result.test, "val": result.best_val, "calls": result.calls, "tokens": result.tokens,
        "wall_s": round(time.perf_counter() - start, 1), "generations": result.generations,
        "weights_version": result.weights_version, "best_graph": graph.model_dump(mode="json"),
        "seed_vals": seeds, "per_input": {t.input_id: float(t.reward or 0.0) for t in tests},
    }


def run_row(args: argparse.Namespace) -> dict[str, Any]:
    from evoagent.graph import graph_from_dict

    out = tempfile.mkdtemp(prefix="evoagent-headline-")
    try:
        spec = spec_for(args.task, args.row, out, args.budget, args.model)
        if args.row in ("seed", "evolve", "rl", "joint"):
            return run_search(spec)
        seed = graph_from_dict(json.loads(Path(args.seed_graph).read_text()), "the seed row's best agent")
        import baselines

        if args.row == "gepa":
            return asyncio.run(baselines.gepa_row(spec, seed, args.budget, args.gepa_minutes))
        return baselines.trl_grpo_row(spec, seed, args.budget, args.trl_minutes)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def code_hash(task: str) -> str:
    """What a finished row's figures depend on: evoagent's and bench/'s code, the seed graphs
    and the task's folder. A kept row is reused only while this is unchanged."""
    files = [*sorted((ROOT / "evoagent").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py")),
             *sorted((ROOT / "graphs").rglob("*.yaml")), *sorted(Path(task).resolve().parent.glob("*"))]
    h = hashlib.sha256()
    for f in files:
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:16]


def spawn(task: str, row: str, opts: argparse.Namespace, budget: int | None, seed_graph: Path,
          partial: Path) -> dict[str, Any]:
    """One row in its own process; a row finished by an earlier, interrupted or narrower run
    (``--rows``) of the same code and settings is kept from ``partial`` instead."""
    cmd = [sys.executable, __file__, "--task", task, "--row", row, "--seed-graph", str(seed_graph),
           "--trl-minutes", str(opts.trl_minutes), "--gepa-minutes", str(opts.gepa_minutes)]
    if budget is not None:
        cmd += ["--budget", str(budget)]
    if opts.model is not None:
        cmd += ["--model", opts.model]
    name = Path(task).resolve().parent.name
    key = {"task": name, "row": row, "budget": budget, "quick": bool(opts.quick),
           "trl_minutes": opts.trl_minutes, "gepa_minutes": opts.gepa_minutes, "code": code_hash(task)}
    what = f"{name}: {row}" + (f" (budget {budget} calls)" if budget else "")
    return run_kept(cmd, ROW_MARK, what, key, partial)


# -- statistics ----------------------------------------------------------------------------------
def paired(rows: dict[str, dict[str, Any]]) -> tuple[list[str], dict[str, np.ndarray]]:
    """Every row's test rewards on the same inputs, in one order."""
    ids = sorted(rows["seed"]["per_input"])
    for name, r in rows.items():
        if sorted(r["per_input"]) != ids:
            sys.exit(f"row {name} was tested on other inputs than the seed row")
    return ids, {name: np.array([r["per_input"][i] for i in ids]) for name, r in rows.items()}


def bootstrap_ci(values: np.ndarray, draws: np.ndarray) -> list[float]:
    """95% percentile interval of the mean over the resampled input indices ``draws``."""
    means = values[draws].mean(axis=1)
    return [round(float(np.percentile(means, 2.5)), 3), round(float(np.percentile(means, 97.5)), 3)]


def summarize(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ids, vals = paired(rows)
    draws = np.random.default_rng(0).integers(0, len(ids), size=(BOOTSTRAP, len(ids)))
    table = {
        name: {"test": round(float(v.mean()), 3), "ci": bootstrap_ci(v, draws),
               **{k: rows[name][k] for k in ("calls", "tokens", "wall_s")}}
        for name, v in vals.items()
    }
    out: dict[str, Any] = {"test_inputs": len(ids), "rows": table,
                           "details": {n: {k: v for k, v in r.items() if k != "per_input"} for n, r in rows.items()}}
    if "joint" in vals and len(vals) > 1:
        best = max((n for n in vals if n != "joint"), key=lambda n: (vals[n].mean(), n))
        out["best_other"] = best
        out["joint_minus_best_other"] = bootstrap_ci(vals["joint"] - vals[best], draws)
    return out


def markdown(figures: dict[str, Any]) -> str:
    v = figures["versions"]
    lines = [
        "| task | row | test | 95% CI | model calls | tokens | wall (min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, t in figures["tasks"].items():
        for name in ROWS:
            if name in t["rows"]:
                r = t["rows"][name]
                lines.append(f"| {task} | {name} | {r['test']:.3f} | [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] | "
                             f"{r['calls']} | {r['tokens']} | {r['wall_s'] / 60:.1f} |")
        if "joint_minus_best_other" in t:
            lo, hi = t["joint_minus_best_other"]
            lines.append(f"| {task} | joint - {t['best_other']} | | [{lo:+.3f}, {hi:+.3f}] | | | |")
    lines += ["", f"`{figures['command']}` on {figures['machine']}; test inputs per task: "
              + ", ".join(f"{k} {t['test_inputs']}" for k, t in figures["tasks"].items())
              + "; " + ", ".join(f"{k} {val}" for k, val in v.items()) + "."]
    return "\n".join(lines) + "\n"


def versions() -> dict[str, str]:
    out = {}
    for pkg in ("evoagent-ml", "gepa", "trl", "transformers", "torch"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# -- the whole run -------------------------------------------------------------------------------
def refuse(message: str) -> None:
    print(f"headline: {message}", file=sys.stderr)
    sys.exit(2)


def tiny_model(folder: Path) -> str:
    """A random two-layer Llama with the embedded model's tokenizer (``--quick``)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from evoagent.llm.embedded import embedded_model_dir

    tok = AutoTokenizer.from_pretrained(embedded_model_dir())
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help="comma-separated task.yaml files")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    ap.add_argument("--quick", action="store_true", help="a tiny random model and tiny budgets (CI)")
    ap.add_argument("--require-signal", action="store_true",
                    help="refuse tasks whose seeds all score 0 even with --quick (always on without it)")
    ap.add_argument("--out", help="results folder (default bench/results; --quick: a temporary one)")
    ap.add_argument("--trl-minutes", type=float, default=10.0, help="wall-clock cap of the TRL row")
    ap.add_argument("--gepa-minutes", type=float, default=10.0, help="wall-clock cap of the GEPA row")
    for hidden in ("--task", "--row", "--seed-graph", "--model"):  # internal: one row in this process
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        print(ROW_MARK + json.dumps(run_row(args)), flush=True)
        return

    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        refuse(f"--rows: unknown row(s) {unknown}; known: {list(ROWS)}")
    rows = ["seed"] + [r for r in ROWS if r in rows and r != "seed"]  # seed first: it picks the seed agent
    for row in rows:
        if row in NEEDS and importlib.util.find_spec(NEEDS[row][0]) is None:
            refuse(f"the {row} row needs the {NEEDS[row][1]} package, which is not installed: "
                   "pip install 'evoagent-ml[bench]' (or leave the row out with --rows)")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    from evoagent.errors import EvoagentError
    from evoagent.spec import check_spec, load_spec

    for t in tasks:
        try:
            check_spec(load_spec(t))
        except (EvoagentError, OSError) as e:
            refuse(f"{t}: {e}")
    out_dir = Path(args.out) if args.out else (Path(tempfile.mkdtemp(prefix="headline-")) if args.quick else RESULTS)
    work = Path(tempfile.mkdtemp(prefix="headline-work-"))
    if args.quick:
        args.model = tiny_model(work / "tiny-model")
    partial = (work if args.quick else out_dir) / "headline.partial.jsonl"
    partial.parent.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {}
    try:
        for task in tasks:
            name = Path(task).resolve().parent.name
            got: dict[str, dict[str, Any]] = {}
            seed_graph = work / f"{name}-seed.json"
            got["seed"] = spawn(task, "seed", args, None, seed_graph, partial)
            if got["seed"]["val"] <= 0 and (args.require_signal or not args.quick):
                refuse(f"{task}: every seed agent scores 0 on val ({got['seed']['seed_vals']}): no "
                       "learning signal exists (GRPO groups that all fail give no gradient, and "
                       "reflection sees no success). Make the task easier (the generator's options), "
                       "give partial credit in the reward, or add a seed agent that sometimes succeeds; "
                       "nothing was written")
            seed_graph.write_text(json.dumps(got["seed"]["best_graph"]))
            budget = None
            if "joint" in rows:
                got["joint"] = spawn(task, "joint", args, None, seed_graph, partial)
                budget = int(got["joint"]["calls"])
            for row in rows:
                if row in got:
                    continue
                if budget is None:
                    refuse("the budgeted rows need the joint row: its spending is their budget")
                got[row] = spawn(task, row, args, budget, seed_graph, partial)
            done[name] = summarize(got)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    dest = out_dir / "headline.json"
    figures = json.loads(dest.read_text()) if dest.exists() else {"tasks": {}}
    figures["tasks"].update(done)
    figures |= {"command": "python bench/headline.py " + " ".join(sys.argv[1:]),
                "machine": f"{os.uname().machine}, {len(os.sched_getaffinity(0))} cores",
                "versions": versions(), "quick": bool(args.quick)}
    out_dir.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(figures, indent=2) + "\n")
    (out_dir / "headline.md").write_text(markdown(figures))
    if set(rows) == set(ROWS):  # a narrower run keeps its rows for the full one
        partial.unlink(missing_ok=True)
    print(markdown(figures))
    print(f"wrote {dest} and {out_dir / 'headline.md'}")


if __name__ == "__main__":
    main()
