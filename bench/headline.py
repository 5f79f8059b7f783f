"""The headline: does evolving the program and training the weights together beat each alone,
and beat GEPA and TRL, at the same budget?

Per task (an ``examples/<name>/task.yaml``) and run seed, six rows on the same policy model,
reward and test inputs:

1. ``seed``: the best seed agent by val (no search);
2. ``gepa``: GEPA optimizing the seed agent's system texts (``bench/baselines.py``);
3. ``trl_grpo``: TRL's GRPOTrainer on the seed agent's prompts, weights only;
4. ``evolve``: evoagent without RL; 5. ``rl``: evoagent's RL phases without program search
   (``evolve.children: 0``); 6. ``joint``: evoagent as the task is written, with the RL
   schedule ``--schedule`` (it ends on a search generation either way), stopped by the task's
   generations or, with ``--joint-budget N``, once it has spent N completions.

Every row that has a mutator gets the same one (``--mutator``: evolve's and joint's mutator,
GEPA's reflection LM); the policy is the task's (``--policy`` replaces it). A run seed
(``--seeds``) seeds the search, the RL and the draw of train and val; every seed is tested on
the same inputs (``task.splits.test_seed``, ``TEST_SEED`` unless the task sets it), disjoint by
question from train and val.

The budget is what the joint row spends, counted in completions the models generated (policy
and mutator; cache hits are free): every other search row of the same seed gets it
(``evolve.max_calls``, GEPA's stopper, TRL's steps), and each row reports what it spent
(``calls``, ``tokens``). GEPA and TRL also stop at a wall-clock cap (``--gepa-minutes``,
``--trl-minutes``), a safety stop set high enough never to bind: each such row records whether
it did (``capped``). Minutes never decide a row.

Each (task, row, seed) is a cell (``bench/cells.py``): its own process and its own file
``<out>/headline/<task>/<row>-s<seed>.json`` with the command, the commit it ran at, the budget
it spent and each test input's reward. A run does only the missing cells, so a campaign that
is killed resumes where it stopped, each cell in its own run folder kept until the cell is
written (``run_folder``): an evoagent row (seed, evolve, rl, joint) in its archive, GEPA in its
saved state, TRL from its last checkpoint.
Run it from a ``git worktree`` at one commit, writing into main's results. Once every asked
cell is in, ``headline.json`` and ``headline.md`` are built from the cells of that commit: a
row's score is its mean over seeds, with a 95% CI from a two-level bootstrap (seeds, then test
inputs within each drawn seed), paired across rows, and joint minus the best other row; the
summary names the commit and what changed in evoagent/ since.

    python bench/headline.py [--tasks examples/sums/task.yaml,...] [--seeds 0,1,2]
                             [--rows seed,joint,...] [--mutator NAME] [--schedule adaptive]
                             [--joint-budget 2000]
    python bench/headline.py --plan        # done, missing and other-commit cells, hours left
    python bench/headline.py --summarize   # headline.json/.md from the cells at their commit
    python bench/headline.py --quick       # a tiny random model: checks the wiring, not the numbers
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import cells  # bench/ is sys.path[0] when a script runs
import failures
import numpy as np
from results_io import RESULTS

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("seed", "gepa", "trl_grpo", "evolve", "rl", "joint")
SEARCHES = 50  # generations of the budgeted rows: the budget, not this, ends them
TEST_SEED = 0  # the test draw of every run seed, unless the task fixes its own: the pool run seed 0
# draws, where sums' 400 draws of about 200 questions hold the 176 distinct ones its splits need
MUTATES = ("gepa", "evolve", "joint")  # the rows with a mutator (GEPA's reflection LM)
SEARCHED = ("seed", "evolve", "rl", "joint")  # evoagent's rows (the others are baselines.py's)
NEEDS = {"gepa": ("gepa", "gepa"), "trl_grpo": ("trl", "trl")}  # row -> (module, pip package)
DEFAULT_TASKS = ("examples/sums/task.yaml", "examples/equations/task.yaml")
MUTATOR = "embedded"  # the 135M: more children that beat their parent per CPU-minute (README)
GUESS_S = {"seed": 120.0, "joint": 3600.0, "gepa": 3600.0, "trl_grpo": 3600.0, "evolve": 2400.0, "rl": 2400.0}
BOOTSTRAP = 5000


# -- one row, in its own process ---------------------------------------------------------------
def spec_for(task: str, row: str, out: str, budget: int | None, opts: argparse.Namespace) -> Any:
    """The task's spec as this row runs it: the run seed ``opts.run_seed``; ``opts.mutator``
    for the rows that mutate (evolve, joint, GEPA's reflection); ``opts.policy`` replacing the
    task's policy model; under ``opts.quick`` the data and budgets shrunk to a wiring check,
    and with ``opts.model`` (``--quick``'s tiny folder) that model as both, the mutator as a
    backend of its own."""
    from evoagent.check import check_spec
    from evoagent.spec import load_spec
    from evoagent.spec.config import RunSpec

    d = load_spec(task).model_dump(mode="json") | {"output": out}
    d["seed"] = opts.run_seed
    if d["task"]["splits"]["test_seed"] is None:
        d["task"]["splits"]["test_seed"] = TEST_SEED
    if opts.policy:
        d["policy"]["model"] = opts.policy
    if opts.operator_policy:
        d["evolve"]["operator_policy"]["kind"] = opts.operator_policy
    mutator = {**d["policy"], "model": opts.mutator} if opts.mutator else d["mutator"]
    if opts.model is not None:  # --quick's tiny model, as the policy and as a mutator of its own
        d["policy"] |= {"model": opts.model, "dtype": "float32", "max_batch": 16}
        mutator = {**d["policy"], "max_batch": 8}
    if opts.quick:  # its data and budgets, also where no model is loaded (the checks, the summary)
        d["task"]["dataset"]["size"] = 40
        d["task"]["splits"] |= {"train": 4, "val": 4, "test": 4, "exclude": None}
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
    elif row == "joint":
        if opts.schedule:
            d["rl"]["schedule"] = opts.schedule
        if opts.joint_budget:  # the budget, not the task's generations, ends the joint row
            d["evolve"] |= {"generations": SEARCHES, "max_calls": opts.joint_budget}
    elif row == "rl":
        d["rl"] |= {"enabled": True, "every": 1}
        d["evolve"] |= {"generations": SEARCHES, "children": 0, "max_calls": budget}
    spec = RunSpec.model_validate(d)
    check_spec(spec)
    return spec


def run_search(spec: Any) -> dict[str, Any]:
    """An evoagent row: ``runner.run`` on ``spec``; its figures and the best agent's test
    rewards."""
    from evoagent import runner
    from evoagent.archive.store import Archive
    from evoagent.evolve.hooks import NullReporter

    class Log(NullReporter):
        def log(self, message: str) -> None:
            print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    from evoagent.archive.views import rl_phases
    from evoagent.rl.schedule import recorded

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
        steps = recorded(archive)
        phases = [{"weights_version": p["weights_version"], "generation": p["generation"],
                   "rolled_back": bool(p.get("rolled_back"))} for p in rl_phases(archive)]
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
        # the joint loop's steps: each search generation and RL phase, what it cost and gained
        "steps": [st.to_json() for st in steps],
        "phases": phases,
        "rl_share": round(sum(st.requests for st in steps if st.kind == "rl") / max(sum(st.requests for st in steps), 1), 3),
        "ended_on": steps[-1].kind if steps else None,
    }


def run_row(args: argparse.Namespace) -> dict[str, Any]:
    """One row's figures, worked out in the cell's run folder (``run_folder``), so a killed cell
    goes on where it stopped: evoagent's rows in their archive, GEPA in its saved state, TRL
    from its last checkpoint."""
    from evoagent.graph import graph_from_dict

    folder = run_folder(args)
    spec = spec_for(args.task, args.row, str(folder), args.budget, args)
    if args.row in SEARCHED:
        return run_search(spec)
    seed = graph_from_dict(json.loads(Path(args.seed_graph).read_text()), "the seed row's best agent")
    import baselines

    if args.row == "gepa":
        return asyncio.run(baselines.gepa_row(spec, seed, args.budget, args.gepa_minutes, folder))
    return baselines.trl_grpo_row(spec, seed, args.budget, args.trl_minutes, folder)


def run_folder(args: argparse.Namespace) -> Path:
    """Where a cell keeps its unfinished run: under the campaign's folder for
    this commit (``cells.work_dir``), named by the cell and by what else its figures depend on
    (``settings``, the budget), so that only the same cell of the same campaign resumes it."""
    key = json.dumps([settings(args, args.row), args.budget, args.task], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return cells.work_dir("headline") / f"{args.cell[0]}-{args.row}-s{args.run_seed}-{digest}"


def task_key(task: str, opts: argparse.Namespace) -> str:
    """The results key of a task (its cells' folder): its folder's name, with the policy model
    or the operator policy when they are replaced."""
    name = Path(task).resolve().parent.name
    name += f"+policy={opts.policy}" if opts.policy else ""
    name += f"+operators={opts.operator_policy}" if opts.operator_policy else ""
    return re.sub(r"[^A-Za-z0-9._+=-]", "_", name)


def run_cell(task: str, cell: cells.Cell, opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One cell in its own process (this script with ``--cell``), after the cells it needs: the
    seed row's best agent (every row starts from it) and the joint row's spending (the budget)."""
    sibling = lambda row: cells.read(opts.cells, cells.Cell(cell.task, row, cell.seed))  # noqa: E731
    cmd = [__file__, "--cell", cell.task, cell.row, str(cell.seed), "--task", task,
           "--out", str(opts.out_dir), "--trl-minutes", str(opts.trl_minutes),
           "--gepa-minutes", str(opts.gepa_minutes), "--mutator", opts.mutator, "--policy", opts.policy,
           "--operator-policy", opts.operator_policy, "--schedule", opts.schedule,
           "--joint-budget", str(opts.joint_budget)]
    if cell.row != "seed":
        seed_graph = work / f"{cell.task}-{cell.seed}-seed.json"
        seed_graph.write_text(json.dumps(sibling("seed")["best_graph"]))
        cmd += ["--seed-graph", str(seed_graph)]
    if cell.row not in ("seed", "joint"):
        cmd += ["--budget", str(int(sibling("joint")["calls"]))]
    if opts.model is not None:
        cmd += ["--model", opts.model]
    if opts.quick:  # the cell keeps the campaign's settings, --quick among them
        cmd.append("--quick")
    return cells.spawn(opts.cells, cell, cmd)


# -- statistics ----------------------------------------------------------------------------------
Runs = dict[str, dict[int, dict[str, Any]]]  # row -> run seed -> that row's result


def paired(rows: Runs, ref: str = "seed") -> dict[int, tuple[list[str], dict[str, np.ndarray]]]:
    """Per run seed: its test inputs in one order and every row's rewards on them, the shape
    ``bootstrap`` pairs; every row must have been tested on row ``ref``'s inputs."""
    out = {}
    for seed, first in rows[ref].items():
        ids = sorted(first["per_input"])
        for name, runs in rows.items():
            if sorted(runs[seed]["per_input"]) != ids:
                sys.exit(f"row {name} (seed {seed}) was tested on other inputs than the {ref} row")
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
            **steps_of(rows[n].values()),
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
    if {"joint", "evolve", "rl"} <= set(names):
        out["fixes"] = failures.fix_sets(rows)
    if "joint" in names and len(names) > 1:
        best = max((n for n in names if n != "joint"), key=lambda n: (means[n], n))
        out["best_other"] = best
        out["joint_minus_best_other"] = interval(boot["joint"] - boot[best])
        out["joint_minus_best_other_per_seed"] = {
            str(s): round(float((per_seed[s]["joint"] - per_seed[s][best]).mean()), 3)
            for s in per_seed
        }
    return out


def steps_of(results: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """A row's program-search generations (those that made children) and RL phases, mean over
    seeds; empty for a row with no steps of the joint loop (seed, GEPA, TRL). Where joint does
    not add the halves' fixes up, this says whether it had the search generations to find the
    program fixes evolve-only found."""
    runs = [r["steps"] if isinstance(r.get("steps"), list) else [] for r in results]  # TRL's: a count
    if not any(runs):
        return {}

    def mean(kind: str) -> float:
        return round(float(np.mean([sum(1 for s in steps if s["kind"] == kind and s["requests"] > 0)
                                     for steps in runs])), 1)

    return {"search_generations": mean("search"), "rl_phases": mean("rl")}


def rl_of(joint: dict[str, dict[str, Any]]) -> str:
    """Joint's RL phases and their share of its completions, seed by seed: under a budget it
    skips a phase that would leave no search generation, so a seed may have none."""
    return ", ".join(f"{seed}: {j['phases']} ({j['rl_share']:.0%} of its completions)"
                     for seed, j in joint.items()) or "-"


def markdown(figures: dict[str, Any]) -> str:
    lines = [
        "| task | row | test (mean of seeds) | 95% CI | per seed | model calls | search gens / RL phases "
        "| tokens | wall (min) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task, t in figures["tasks"].items():
        for name in ROWS:
            if name in t["rows"]:
                r = t["rows"][name]
                seeds = ", ".join(f"{v:.3f}" for v in r["per_seed"].values())
                steps = f"{r['search_generations']:g} / {r['rl_phases']:g}" if "rl_phases" in r else "-"
                lines.append(
                    f"| {task} | {name} | {r['test']:.3f} | [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] | "
                    f"{seeds} | {r['calls']:.0f} | {steps} | {r['tokens']:.0f} | {r['wall_s'] / 60:.1f} |"
                )
        if "joint_minus_best_other" in t:
            lo, hi = t["joint_minus_best_other"]
            seeds = ", ".join(f"{v:+.3f}" for v in t["joint_minus_best_other_per_seed"].values())
            lines.append(
                f"| {task} | joint - {t['best_other']} | | [{lo:+.3f}, {hi:+.3f}] | {seeds} | | | | |"
            )
    lines.append("")
    for task, t in figures["tasks"].items():
        if (f := t.get("fixes")) is not None:
            lines.append(
                f"- {task}, summed over seeds: of the inputs the seed agent got wrong, evolve-only fixed "
                f"{f['evolve']}, RL-only {f['rl']}, both {f['both']} (union - max: {f['union_minus_max']}); "
                f"joint fixed {f['joint_of_union']} of that union and {f['joint_other']} others, and broke "
                f"{f['joint_broke']} the seed agent got right."
            )
    changed = figures["evoagent_changed_since"].splitlines()
    lines.append(f"Every cell ran at commit {figures['commit'][:10]}; evoagent/ since then: "
                 f"{changed[-1].strip() if changed else 'unchanged'}.")
    for task, t in figures["tasks"].items():
        inputs = sorted(set(t["test_inputs"].values()))
        lines.append(
            f"- {task}: `{t['command']}`; seeds {t['seeds']}, {'/'.join(map(str, inputs))} test "
            f"inputs each; mutator {t['mutator']}, joint's schedule {t['schedule']} (its last step: "
            f"{'/'.join(t['joint_ended_on']) or '-'}; its RL phases by seed: {rl_of(t['joint_rl'])}), "
            f"policy {t['policy']}, "
            f"operator policy {t['operator_policy']}; wall-clock cap bound in {t['capped'] or 'no cell'}; "
            f"its cells {cells.describe_environments(t['environments'])}"
        )
    for task, t in figures["tasks"].items():
        if t.get("failures"):
            lines += ["", *failures.markdown(task, t["failures"])]
    return "\n".join(lines).rstrip("\n") + "\n"


# -- the whole run -------------------------------------------------------------------------------
def test_split(task: str, opts: argparse.Namespace) -> list[Any]:
    """The test inputs every seed of ``task`` is scored on, each with what its question is,
    drawn as the cells drew them (``spec_for``: one test split under every run seed)."""
    from evoagent.tasks.datasets import task_data

    spec = spec_for(task, "seed", "unused", None, argparse.Namespace(**{**vars(opts), "run_seed": 0}))
    return task_data(spec.task, spec.seed, Path(spec.base_dir))[1]["test"]


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
    ap.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help="comma-separated task.yaml files")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds; each is a full set of rows")
    ap.add_argument("--mutator", default=MUTATOR,
                    help="the model of every row's mutator (evolve, joint, GEPA); '' keeps the task's")
    ap.add_argument("--policy", default="", help="a policy model replacing the task's ('' keeps it)")
    ap.add_argument("--operator-policy", default="", help="evolve.operator_policy.kind ('' keeps the task's)")
    ap.add_argument("--schedule", default="", help="the joint row's rl.schedule ('' keeps the task's)")
    ap.add_argument("--joint-budget", type=int, default=0,
                    help="the joint row's evolve.max_calls, its generations then unbounded (0 keeps the task's "
                    "stop); every other budgeted row gets what joint spent")
    ap.add_argument("--quick", action="store_true", help="a tiny random model and tiny budgets (CI)")
    ap.add_argument("--require-signal", action="store_true",
                    help="refuse tasks whose seeds all score 0 even with --quick (always on without it)")
    ap.add_argument("--out", type=Path,
                    help="results folder: headline.json/.md, cells under headline/ (default bench/results; "
                    "--quick: a temporary one)")
    ap.add_argument("--plan", action="store_true", help="list done, missing and other-commit cells, and stop")
    ap.add_argument("--summarize", action="store_true", help="write headline.json/.md from the cells, run none")
    ap.add_argument("--commit", help="the campaign's commit (default: the newest a done cell ran at)")
    ap.add_argument("--trl-minutes", type=float, default=600.0, help="safety cap of the TRL row")
    ap.add_argument("--gepa-minutes", type=float, default=600.0, help="safety cap of the GEPA row")
    ap.add_argument("--cell", nargs=3, metavar=("TASK", "ROW", "SEED"), help=argparse.SUPPRESS)
    cells.add_lane_args(ap)
    for hidden in ("--task", "--seed-graph", "--model"):  # internal: one cell in this process
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.mutator = args.policy = ""  # the tiny model is both
    if args.cell:
        return keep_cell(args)

    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if unknown := [r for r in rows if r not in ROWS]:
        refuse(f"--rows: unknown row(s) {unknown}; known: {list(ROWS)}")
    # seed first (it picks the seed agent), joint next (its spending is the others' budget)
    rows = [r for r in ("seed", "joint", *ROWS) if r in {"seed", *rows}]
    rows = list(dict.fromkeys(rows))
    if len(rows) > 1 and "joint" not in rows:
        refuse("the budgeted rows need the joint row: its spending is their budget")
    for row in rows:
        if row in NEEDS and importlib.util.find_spec(NEEDS[row][0]) is None:
            refuse(f"the {row} row needs the {NEEDS[row][1]} package, which is not installed: "
                   "pip install 'evoagent-ml[bench]' (or leave the row out with --rows)")
    try:
        seeds = sorted({int(x) for x in args.seeds.split(",") if x.strip()})
    except ValueError:
        refuse(f"--seeds: {args.seeds!r} is not a comma-separated list of integers")
    if not seeds:
        refuse("--seeds: name at least one run seed")
    tasks = {task_key(t, args): t for t in (t.strip() for t in args.tasks.split(",")) if t}
    from evoagent.errors import EvoagentError
    from evoagent.llm.embedded import check_model
    from evoagent.rl.schedule import known_schedules

    if args.schedule and args.schedule not in known_schedules():
        refuse(f"--schedule: unknown schedule {args.schedule!r}; known: {known_schedules()}")
    try:
        mutator = args.mutator if set(rows) & set(MUTATES) else ""
        for field, model in (("--mutator", mutator), ("--policy", args.policy)):
            if model:
                check_model(model, field)
    except (EvoagentError, OSError) as e:
        refuse(str(e))
    # Each task as its cells will run it (the test draw, the budget). Once is enough: the pool is
    # drawn at the test seed whatever the run seed (tasks.datasets.data_seed), which only reorders it.
    as_run = argparse.Namespace(**vars(args), run_seed=seeds[0])
    for t in tasks.values():
        try:
            spec_for(t, "joint", tempfile.gettempdir(), None, as_run)
        except (EvoagentError, OSError) as e:
            refuse(f"{t} at run seed {seeds[0]}, as the headline runs it: {e}")
    args.out_dir = args.out or (Path(tempfile.mkdtemp(prefix="headline-")) if args.quick else RESULTS)
    args.cells = args.out_dir / "headline"
    grid = cells.grid(tasks, rows, seeds)
    if args.plan or args.summarize:
        at = cells.summary_commit(args.commit, args.cells, grid)
        if args.plan:
            print(cells.plan(args.cells, grid, at, lambda c: GUESS_S[c.row]).describe())
        else:
            summarize_campaign(args, tasks, grid, at)
        return
    head, dirty = cells.commit()
    if dirty and not args.quick:
        refuse("evoagent/ or bench/ has uncommitted changes: a campaign runs at one commit "
               "(run it from a git worktree of that commit)")
    todo = cells.plan(args.cells, grid, head, lambda c: GUESS_S[c.row])
    print(todo.describe(), flush=True)
    if args.lanes > 1 and args.chains is None:
        stale = [c for c in grid if kept(c, args, head) is None]
        cells.run_lanes([*sys.argv, "--out", str(args.out_dir)], cells.deal(stale, args.lanes))  # --quick: one folder
    else:
        run_chains(args, tasks, cells.in_chains(grid, args.chains), head)
    if args.chains is None:  # a lane leaves the summary to the campaign that started it
        summarize_campaign(args, tasks, grid, head)


def run_chains(args: argparse.Namespace, tasks: dict[str, str], grid: list[cells.Cell], at: str) -> None:
    """Run ``grid``'s cells in order (a row needs its seed's seed and joint rows first), each
    unless it is kept at commit ``at`` with this campaign's settings when its turn comes, so a
    cell that another process finished meanwhile is not run again; refuse a task whose seed
    agents all score 0."""
    work = Path(tempfile.mkdtemp(prefix="headline-work-"))
    args.model = tiny_model(work / "tiny-model") if args.quick else None
    try:
        for cell in grid:
            data = kept(cell, args, at) or run_cell(tasks[cell.task], cell, args, work)
            if cell.row == "seed" and data["val"] <= 0 and (args.require_signal or not args.quick):
                refuse(f"{tasks[cell.task]} (seed {cell.seed}): every seed agent scores 0 on val "
                       f"({data['seed_vals']}): no learning signal exists (GRPO groups that all "
                       "fail give no gradient, and reflection sees no success). Make the task easier "
                       "(the generator's options), give partial credit in the reward, or add a seed "
                       "agent that sometimes succeeds")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def keep_cell(args: argparse.Namespace) -> None:
    """``--cell``: run one cell in this process and keep it."""
    task_id, row, seed = args.cell
    args.row, args.run_seed = row, int(seed)
    cell = cells.Cell(task_id, row, int(seed))
    with cells.stopwatch(run_folder(args)) as elapsed:  # a resumed cell counts its earlier stretches
        result = run_row(args) | {"budget": args.budget, "settings": settings(args, row),
                                  "mutator": args.mutator or "the task's",
                                  "schedule": (args.schedule or "the task's") if row == "joint" else None}
    command = "python bench/headline.py " + " ".join(a for a in sys.argv[1:] if a != "--cell")
    print("wrote", cells.write(args.out / "headline", cell, result, command, elapsed()))
    shutil.rmtree(run_folder(args), ignore_errors=True)  # kept: its run is no longer needed


def settings(args: argparse.Namespace, row: str) -> dict[str, Any]:
    """What a row's figures depend on besides the commit, the task and the seed."""
    return {"mutator": args.mutator if row in MUTATES else None, "policy": args.policy,
            "operator_policy": args.operator_policy, "schedule": args.schedule if row == "joint" else None,
            "joint_budget": args.joint_budget if row == "joint" else None,
            "trl_minutes": args.trl_minutes if row == "trl_grpo" else None,
            "gepa_minutes": args.gepa_minutes if row == "gepa" else None, "quick": bool(args.quick)}


def kept(cell: cells.Cell, args: argparse.Namespace, at: str) -> dict[str, Any] | None:
    """``cell``'s kept result if it belongs to this campaign (it ran at commit ``at``, with its
    settings and budget: ``mismatch``), else None: the cell must run."""
    data = cells.read(args.cells, cell)
    return data if data is not None and data["commit"] == at and mismatch(cell, data, args) is None else None


def mismatch(cell: cells.Cell, data: dict[str, Any] | None, args: argparse.Namespace) -> str | None:
    """Why a kept cell does not belong to this campaign (None when it does): it ran with other
    settings, or (a budgeted row) at another budget than its seed's joint row spent."""
    if data is None:
        return "missing"
    if data.get("settings") != settings(args, cell.row):
        return f"ran with other settings ({data.get('settings')})"
    if cell.row not in ("seed", "joint"):
        joint = cells.read(args.cells, cells.Cell(cell.task, "joint", cell.seed))
        if joint is None or data.get("budget") != int(joint["calls"]):
            return f"ran at budget {data.get('budget')}, not what its joint row spent"
    return None


def summarize_campaign(args: argparse.Namespace, tasks: dict[str, str], grid: list[cells.Cell], at: str) -> None:
    """headline.json and headline.md from the cells of commit ``at`` (all of them, or none),
    each with this campaign's settings and budget."""
    got = cells.gather(args.cells, grid, at, dirty_ok=args.quick)
    for cell, data in got.items():
        if (why := mismatch(cell, data, args)) is not None:
            refuse(f"cell {cell} {why}: run the campaign with these settings to redo it")
    figures: dict[str, Any] = {"tasks": {}, "quick": bool(args.quick), "commit": at,
                               "evoagent_changed_since": cells.drift(at)}
    for key, task in tasks.items():
        mine = {c: r for c, r in got.items() if c.task == key}
        runs: Runs = {}
        for c, r in sorted(mine.items()):
            runs.setdefault(c.row, {})[c.seed] = r
        runs = {"seed": runs.pop("seed"), **runs}
        first = runs["seed"][min(runs["seed"])]
        joint = [r for c, r in mine.items() if c.row == "joint"]
        figures["tasks"][key] = summarize(runs) | {
            "task": task,
            "command": "python bench/headline.py " + " ".join(sys.argv[1:]),
            "mutator": first.get("mutator", "the task's"),
            "schedule": joint[0].get("schedule") if joint else None,
            "joint_ended_on": sorted({str(r.get("ended_on")) for r in joint}),  # "search": on the program
            # joint may skip RL (a phase that would leave no search within the budget): say where
            "joint_rl": {str(c.seed): {"phases": len(r.get("phases", [])), "rl_share": r.get("rl_share", 0.0)}
                         for c, r in sorted(mine.items()) if c.row == "joint"},
            "capped": sorted(str(c) for c, r in mine.items() if r.get("capped")),
            "policy": args.policy or "the task's",
            "operator_policy": args.operator_policy or "the task's",
            "environments": cells.environments(mine.values()),
        }
        # which failures each row fixed, told by the questions
        ordered = {r: runs[r] for r in ROWS if r in runs}
        figures["tasks"][key]["failures"] = failures.profile(test_split(task, args), ordered)
    cells.write_summary(args.out_dir / "headline.json", figures, args.cells, grid, at, Path(__file__))
    (args.out_dir / "headline.md").write_text(markdown(figures))
    print(markdown(figures))


if __name__ == "__main__":
    main()
