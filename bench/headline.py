"""The headline: does evolving the program and training the weights together beat each alone,
and beat GEPA and TRL, at the same budget?

Per task (an ``examples/<name>/task.yaml``) and run seed, six rows on the same policy model,
reward and splits, each in its own process:

1. ``seed``: the best seed agent by val (no search);
2. ``gepa``: GEPA optimizing the seed agent's system texts (``bench/baselines.py``);
3. ``trl_grpo``: TRL's GRPOTrainer on the seed agent's prompts, weights only;
4. ``evolve``: evoagent without RL; 5. ``rl``: evoagent's RL phases without program search
   (``evolve.children: 0``); 6. ``joint``: evoagent as the task is written.

Every row that has a mutator gets the same one (``--mutator``, by default the embedded
Qwen2.5-Coder-1.5B-Instruct: evolve's and joint's mutator, GEPA's reflection LM); the policy
is the task's (``--policy`` replaces it). The run seed (``--seeds``) seeds the data, the splits,
the search and the RL; each seed is a full set of rows.

The budget is what the joint row spends, counted in completions the models generated (policy
and mutator; cache hits are free): every other search row of the same seed gets it
(``evolve.max_calls``, GEPA's stopper, TRL's steps), and each row reports what it spent
(``calls``, ``tokens``). GEPA and TRL also stop at a wall-clock cap (``--gepa-minutes``,
``--trl-minutes``): on a CPU both are far slower per completion than evoagent's batched rows,
and a row stopped early says so by spending fewer calls than the budget. The test split is
scored once per row and seed; a row's score is the mean over seeds, and its 95% CI comes from a
two-level bootstrap (seeds, then the test inputs within each drawn seed), paired across rows,
for each row and for joint minus the best other row. Writes ``bench/results/headline.json``
(each task with the command that made its rows) and ``bench/results/headline.md`` (the
README's table) only when every asked row of every asked task and seed finished; other tasks
already in the file are kept. Each finished row is also kept in
``bench/results/headline.partial.jsonl`` until a run of all six rows: an interrupted run, or one
asked for fewer rows (``--rows seed,joint``), is picked up by the next without re-running a row,
as long as the code, the task and the settings match.

    python bench/headline.py [--tasks examples/sums/task.yaml,...] [--seeds 0,1,2]
                             [--rows seed,joint,...] [--mutator NAME] [--policy NAME]
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
from code_graph import manifest  # bench/ is sys.path[0] when a script runs
from results_io import RESULTS, STARTED, run_kept

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("seed", "gepa", "trl_grpo", "evolve", "rl", "joint")
SEARCHES = 50  # generations of the budgeted rows: the budget, not this, ends them
ROW_MARK = "ROW-RESULT "
MUTATES = ("gepa", "evolve", "joint")  # the rows with a mutator (GEPA's reflection LM)
NEEDS = {"gepa": ("gepa", "gepa"), "trl_grpo": ("trl", "trl")}  # row -> (module, pip package)
DEFAULT_TASKS = ("examples/sums/task.yaml", "examples/equations/task.yaml")
MUTATOR = "embedded:qwen2.5-coder-1.5b"
BOOTSTRAP = 5000


# -- one row, in its own process ---------------------------------------------------------------
def spec_for(task: str, row: str, out: str, budget: int | None, opts: argparse.Namespace) -> Any:
    """The task's spec as this row runs it: the run seed ``opts.run_seed``; ``opts.mutator``
    for the rows that mutate (evolve, joint, GEPA's reflection); ``opts.policy`` replacing the
    task's policy model; under ``--quick`` (``opts.model``: a tiny folder) the budgets shrunk
    to a wiring check and the tiny model as both, the mutator as a backend of its own."""
    from evoagent import runner
    from evoagent.spec.config import RunSpec

    spec = runner.prepare(task, output=out)
    d = spec.model_dump(mode="json")
    d["seed"] = opts.run_seed
    if opts.policy:
        d["policy"]["model"] = opts.policy
    if opts.operator_policy:
        d["evolve"]["operator_policy"]["kind"] = opts.operator_policy
    mutator = {**d["policy"], "model": opts.mutator} if opts.mutator else d["mutator"]
    if opts.model is not None:  # --quick
        d["policy"] |= {"model": opts.model, "dtype": "float32", "max_batch": 16}
        mutator = {**d["policy"], "max_batch": 8}
        d["task"]["dataset"]["size"] = 40
        d["task"]["splits"] = {"train": 4, "val": 4, "test": 4}
        d["evolve"] |= {"generations": 2, "children": 2}
        d["evolve"]["cascade"]["minibatch"] = 2
        d["rl"] |= {"every": 1, "steps": 1, "group_size": 2, "inputs_per_step": 2}
        d["graphs"] = d["graphs"][:1]
    if row in MUTATES:
        d["mutator"] = mutator
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
    """An evoagent row: ``runner.run`` on ``spec``; its figures and the best agent's test
    rewards."""
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
        seeds = {
            a.graph.name: archive.score(a.id, "val", 0)
            for a in archive.agents(operator="seed")
            if a.graph
        }
    assert graph is not None
    return {
        "test": result.test,
        "val": result.best_val,
        "calls": result.calls,
        "tokens": result.tokens,
        "wall_s": round(time.perf_counter() - start, 1),
        "generations": result.generations,
        "weights_version": result.weights_version,
        "best_graph": graph.model_dump(mode="json"),
        "seed_vals": seeds,
        "per_input": {t.input_id: float(t.reward or 0.0) for t in tests},
    }


def run_row(args: argparse.Namespace) -> dict[str, Any]:
    from evoagent.graph import graph_from_dict

    out = tempfile.mkdtemp(prefix="evoagent-headline-")
    try:
        spec = spec_for(args.task, args.row, out, args.budget, args)
        if args.row in ("seed", "evolve", "rl", "joint"):
            return run_search(spec)
        seed = graph_from_dict(
            json.loads(Path(args.seed_graph).read_text()), "the seed row's best agent"
        )
        import baselines

        if args.row == "gepa":
            return asyncio.run(baselines.gepa_row(spec, seed, args.budget, args.gepa_minutes))
        return baselines.trl_grpo_row(spec, seed, args.budget, args.trl_minutes)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def code_files(task: str) -> dict[str, str]:
    """What a row's figures depend on: this script and every module it can reach, the seed
    graphs and the task's folder, as they were when this run started (``code_graph.manifest``)."""
    return manifest(Path(__file__), (Path(task).resolve().parent, ROOT / "graphs"), STARTED)


def code_hash(task: str) -> str:
    """One digest of ``code_files``: a kept row is reused only while this is unchanged."""
    return hashlib.sha256(json.dumps(code_files(task), sort_keys=True).encode()).hexdigest()[:16]


def spawn(
    task: str,
    row: str,
    seed: int,
    opts: argparse.Namespace,
    budget: int | None,
    seed_graph: Path,
    partial: Path,
) -> dict[str, Any]:
    """One row of one run seed in its own process; a row finished by an earlier, interrupted
    or narrower run (``--rows``) of the same code and settings is kept from ``partial``."""
    cmd = [
        sys.executable,
        __file__,
        "--task",
        task,
        "--row",
        row,
        "--run-seed",
        str(seed),
        "--seed-graph",
        str(seed_graph),
        "--trl-minutes",
        str(opts.trl_minutes),
        "--gepa-minutes",
        str(opts.gepa_minutes),
        "--mutator",
        opts.mutator,
        "--policy",
        opts.policy,
        "--operator-policy",
        opts.operator_policy,
    ]
    if budget is not None:
        cmd += ["--budget", str(budget)]
    if opts.model is not None:
        cmd += ["--model", opts.model]
    name = task_name(task, opts)
    key = {
        "task": name,
        "row": row,
        "seed": seed,
        "budget": budget,
        "quick": bool(opts.quick),
        "mutator": opts.mutator,
        "policy": opts.policy,
        "operator_policy": opts.operator_policy,
        "trl_minutes": opts.trl_minutes,
        "gepa_minutes": opts.gepa_minutes,
        "code": code_hash(task),
    }
    what = f"{name} seed {seed}: {row}" + (f" (budget {budget} calls)" if budget else "")
    return run_kept(cmd, ROW_MARK, what, key, partial)


def task_name(task: str, opts: argparse.Namespace) -> str:
    """The results key of a task: its folder's name, with the policy model or the operator
    policy when they are replaced."""
    name = Path(task).resolve().parent.name
    name += f" (policy {opts.policy})" if opts.policy else ""
    return name + (f" (operators {opts.operator_policy})" if opts.operator_policy else "")


# -- statistics ----------------------------------------------------------------------------------
Runs = dict[str, dict[int, dict[str, Any]]]  # row -> run seed -> that row's result


def paired(rows: Runs) -> dict[int, tuple[list[str], dict[str, np.ndarray]]]:
    """Per run seed: its test inputs in one order and every row's rewards on them."""
    out = {}
    for seed, first in rows["seed"].items():
        ids = sorted(first["per_input"])
        for name, runs in rows.items():
            if sorted(runs[seed]["per_input"]) != ids:
                sys.exit(f"row {name} (seed {seed}) was tested on other inputs than the seed row")
        out[seed] = (
            ids,
            {
                name: np.array([runs[seed]["per_input"][i] for i in ids])
                for name, runs in rows.items()
            },
        )
    return out


def bootstrap(
    per_seed: dict[int, dict[str, np.ndarray]], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """``BOOTSTRAP`` resampled means of every row: seeds drawn with replacement, then each drawn
    seed's test inputs with replacement; the same draws for every row (paired)."""
    seeds = sorted(per_seed)
    names = list(per_seed[seeds[0]])
    out = {n: np.empty(BOOTSTRAP) for n in names}
    picks = rng.integers(0, len(seeds), size=(BOOTSTRAP, len(seeds)))
    for b in range(BOOTSTRAP):
        sums = dict.fromkeys(names, 0.0)
        for k in picks[b]:
            vals = per_seed[seeds[k]]
            draw = rng.integers(
                0, len(next(iter(vals.values()))), size=len(next(iter(vals.values())))
            )
            for n in names:
                sums[n] += vals[n][draw].mean()
        for n in names:
            out[n][b] = sums[n] / len(seeds)
    return out


def interval(samples: np.ndarray) -> list[float]:
    """The 95% percentile interval of bootstrap ``samples``."""
    return [
        round(float(np.percentile(samples, 2.5)), 3),
        round(float(np.percentile(samples, 97.5)), 3),
    ]


def summarize(rows: Runs) -> dict[str, Any]:
    """Each row's mean test score over seeds with its two-level bootstrap CI, and joint minus
    the best other row (by mean) with the CI of the paired difference."""
    per_seed = {seed: vals for seed, (_, vals) in paired(rows).items()}
    names = list(rows)
    means = {n: float(np.mean([per_seed[s][n].mean() for s in per_seed])) for n in names}
    boot = bootstrap(per_seed, np.random.default_rng(0))
    table = {
        n: {
            "test": round(means[n], 3),
            "ci": interval(boot[n]),
            "per_seed": {str(s): round(float(per_seed[s][n].mean()), 3) for s in per_seed},
            **{
                k: round(float(np.mean([r[k] for r in rows[n].values()])), 1)
                for k in ("calls", "tokens", "wall_s")
            },
        }
        for n in names
    }
    out: dict[str, Any] = {
        "seeds": sorted(per_seed),
        "test_inputs": {str(s): len(ids) for s, (ids, _) in paired(rows).items()},
        "rows": table,
        "details": {
            n: {str(s): {k: v for k, v in r.items() if k != "per_input"} for s, r in runs.items()}
            for n, runs in rows.items()
        },
    }
    if "joint" in names and len(names) > 1:
        best = max((n for n in names if n != "joint"), key=lambda n: (means[n], n))
        out["best_other"] = best
        out["joint_minus_best_other"] = interval(boot["joint"] - boot[best])
        out["joint_minus_best_other_per_seed"] = {
            str(s): round(float((per_seed[s]["joint"] - per_seed[s][best]).mean()), 3)
            for s in per_seed
        }
    return out


def markdown(figures: dict[str, Any]) -> str:
    lines = [
        "| task | row | test (mean of seeds) | 95% CI | per seed | model calls | tokens "
        "| wall (min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for task, t in figures["tasks"].items():
        for name in ROWS:
            if name in t["rows"]:
                r = t["rows"][name]
                seeds = ", ".join(f"{v:.3f}" for v in r["per_seed"].values())
                lines.append(
                    f"| {task} | {name} | {r['test']:.3f} | [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] | "
                    f"{seeds} | {r['calls']:.0f} | {r['tokens']:.0f} | {r['wall_s'] / 60:.1f} |"
                )
        if "joint_minus_best_other" in t:
            lo, hi = t["joint_minus_best_other"]
            seeds = ", ".join(f"{v:+.3f}" for v in t["joint_minus_best_other_per_seed"].values())
            lines.append(
                f"| {task} | joint - {t['best_other']} | | [{lo:+.3f}, {hi:+.3f}] | {seeds} | | | |"
            )
    lines.append("")
    for task, t in figures["tasks"].items():
        inputs = sorted(set(t["test_inputs"].values()))
        lines.append(
            f"- {task}: `{t['command']}`; seeds {t['seeds']}, {'/'.join(map(str, inputs))} test "
            f"inputs each; mutator {t['mutator']}, policy {t['policy']}, operator policy "
            f"{t['operator_policy']}; {t['machine']}; "
            + ", ".join(f"{k} {val}" for k, val in t["versions"].items())
        )
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

    from evoagent.llm.embedded import EMBEDDED_NAME, model_folder

    tok = AutoTokenizer.from_pretrained(model_folder(EMBEDDED_NAME))
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tasks", default=",".join(DEFAULT_TASKS), help="comma-separated task.yaml files"
    )
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    ap.add_argument(
        "--seeds", default="0,1,2", help="comma-separated run seeds; each is a full set of rows"
    )
    ap.add_argument(
        "--mutator",
        default=MUTATOR,
        help="the model of every row's mutator (evolve, joint, GEPA); '' keeps the task's",
    )
    ap.add_argument(
        "--policy", default="", help="a policy model replacing the task's ('' keeps it)"
    )
    ap.add_argument(
        "--operator-policy", default="", help="evolve.operator_policy.kind ('' keeps the task's)"
    )
    ap.add_argument(
        "--quick", action="store_true", help="a tiny random model and tiny budgets (CI)"
    )
    ap.add_argument(
        "--require-signal",
        action="store_true",
        help="refuse tasks whose seeds all score 0 even with --quick (always on without it)",
    )
    ap.add_argument(
        "--out", help="results folder (default bench/results; --quick: a temporary one)"
    )
    ap.add_argument("--trl-minutes", type=float, default=10.0, help="wall-clock cap of the TRL row")
    ap.add_argument(
        "--gepa-minutes", type=float, default=10.0, help="wall-clock cap of the GEPA row"
    )
    for hidden in (
        "--task",
        "--row",
        "--seed-graph",
        "--model",
    ):  # internal: one row in this process
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--run-seed", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        print(ROW_MARK + json.dumps(run_row(args)), flush=True)
        return

    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        refuse(f"--rows: unknown row(s) {unknown}; known: {list(ROWS)}")
    rows = ["seed"] + [
        r for r in ROWS if r in rows and r != "seed"
    ]  # seed first: it picks the seed agent
    for row in rows:
        if row in NEEDS and importlib.util.find_spec(NEEDS[row][0]) is None:
            refuse(
                f"the {row} row needs the {NEEDS[row][1]} package, which is not installed: "
                "pip install 'evoagent-ml[bench]' (or leave the row out with --rows)"
            )
    try:
        seeds = sorted({int(x) for x in args.seeds.split(",") if x.strip()})
    except ValueError:
        refuse(f"--seeds: {args.seeds!r} is not a comma-separated list of integers")
    if not seeds:
        refuse("--seeds: name at least one run seed")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    from evoagent.check import check_spec
    from evoagent.errors import EvoagentError
    from evoagent.llm.embedded import check_model
    from evoagent.spec import load_spec

    if args.quick:
        args.mutator = args.policy = ""  # the tiny model is both
    try:
        mutator = args.mutator if set(rows) & set(MUTATES) else ""
        for field, model in (("--mutator", mutator), ("--policy", args.policy)):
            if model:
                check_model(model, field)
        for t in tasks:
            check_spec(load_spec(t))
    except (EvoagentError, OSError) as e:
        refuse(str(e))
    out_dir = (
        Path(args.out)
        if args.out
        else (Path(tempfile.mkdtemp(prefix="headline-")) if args.quick else RESULTS)
    )
    work = Path(tempfile.mkdtemp(prefix="headline-work-"))
    if args.quick:
        args.model = tiny_model(work / "tiny-model")
    partial = (work if args.quick else out_dir) / "headline.partial.jsonl"
    partial.parent.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {}
    try:
        for task in tasks:
            got: Runs = {r: {} for r in rows}
            for seed in seeds:
                for row, result in run_seed(task, seed, rows, args, work, partial).items():
                    got[row][seed] = result
            done[task_name(task, args)] = summarize(got) | {
                "command": "python bench/headline.py " + " ".join(sys.argv[1:]),
                "mutator": args.mutator or "the task's",
                "policy": args.policy or "the task's",
                "operator_policy": args.operator_policy or "the task's",
                "versions": versions(),
                "machine": f"{os.uname().machine}, {len(os.sched_getaffinity(0))} cores",
                "code": code_files(task),
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    dest = out_dir / "headline.json"
    figures = json.loads(dest.read_text()) if dest.exists() else {"tasks": {}}
    figures = {"tasks": {**figures["tasks"], **done}, "quick": bool(args.quick)}
    out_dir.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(figures, indent=2) + "\n")
    (out_dir / "headline.md").write_text(markdown(figures))
    if set(rows) == set(ROWS):  # a narrower run keeps its rows for the full one
        partial.unlink(missing_ok=True)
    print(markdown(figures))
    print(f"wrote {dest} and {out_dir / 'headline.md'}")


def run_seed(
    task: str, seed: int, rows: list[str], args: argparse.Namespace, work: Path, partial: Path
) -> dict[str, dict[str, Any]]:
    """Every asked row of ``task`` at run seed ``seed``: the seed row picks the seed agent, the
    joint row's spending is the others' budget."""
    got: dict[str, dict[str, Any]] = {}
    seed_graph = work / f"{Path(task).resolve().parent.name}-{seed}-seed.json"
    got["seed"] = spawn(task, "seed", seed, args, None, seed_graph, partial)
    if got["seed"]["val"] <= 0 and (args.require_signal or not args.quick):
        refuse(
            f"{task} (seed {seed}): every seed agent scores 0 on val "
            f"({got['seed']['seed_vals']}): no learning signal exists (GRPO groups that all "
            "fail give no gradient, and reflection sees no success). Make the task easier "
            "(the generator's options), give partial credit in the reward, or add a seed "
            "agent that sometimes succeeds; nothing was written"
        )
    seed_graph.write_text(json.dumps(got["seed"]["best_graph"]))
    budget = None
    if "joint" in rows:
        got["joint"] = spawn(task, "joint", seed, args, None, seed_graph, partial)
        budget = int(got["joint"]["calls"])
    for row in rows:
        if row in got:
            continue
        if budget is None:
            refuse("the budgeted rows need the joint row: its spending is their budget")
        got[row] = spawn(task, row, seed, args, budget, seed_graph, partial)
    return got


if __name__ == "__main__":
    main()
