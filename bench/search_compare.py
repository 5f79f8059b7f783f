"""Search strategies at the same budget: which parent selection and operator policy should a
run use by default?

Per task and seed, one program search (no RL) per arm, each in its own process, each stopped by
the same budget of model completions (``evolve.max_calls``; policy and mutator, cache hits
free), all with the same operators (the task's plus ``decompose``, ``best_of_n`` and
``reflexion_retry``):

- ``islands``: FunSearch islands with the operator bandit (the defaults);
- ``dgm``: Darwin Gödel Machine archive sampling;
- ``map_elites``: MAP-Elites over nodes x LLM calls per input;
- ``pareto``: GEPA's per-input Pareto front;
- ``fixed``: islands, operators drawn by their configured weights (``operator_policy: fixed``);
- ``novelty``: islands with novelty rejection (``novelty_threshold: 0.9``; not run by default);
- ``prompt_ops`` and ``instruction_demo_search`` (not run by default): islands with only
  ``bootstrap_demos`` and ``reflective_rewrite``, against only ``instruction_demo_search``
  (MIPROv2-style: the instruction and the demos chosen together by TPE on train minibatches,
  whose executions count toward the same budget), kept in a results file of their own. One
  ``instruction_demo_search`` child costs up to ``trials x inputs`` executions, so a generation
  of them can overshoot the budget by hundreds of completions: ``--match-budget`` gives every
  later arm what the first arm spent, seed by seed, so the arms compare at equal completions::

      python bench/search_compare.py --tasks examples/sums/task.yaml --budget 600 \
          --arms instruction_demo_search,prompt_ops --match-budget --name instruction_search

Each run reports its best val score, the best agent's test score (scored once), what it spent
and how many distinct agents it evaluated. Per arm: the mean over seeds with a 95% t-interval
(seeds also redraw the data splits, so the interval covers both). Writes
``bench/results/<name>.json``, ``<name>.md`` (the README's table) and ``<name>.html`` (the
drawing; ``--draw`` redraws it from the JSON); ``--name`` is ``search_compare`` unless given.

    python bench/search_compare.py [--tasks ...] [--arms islands,fixed] [--seeds 0,1,2] [--budget 240]
                                   [--val 16] [--name search_compare] [--match-budget]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cells
import numpy as np
from headline import run_search
from results_io import RESULTS, run_kept, write_results

ROOT = Path(__file__).resolve().parents[1]
ARMS: dict[str, dict[str, Any]] = {
    "islands": {},
    "dgm": {"selection": {"kind": "dgm"}},
    "map_elites": {"selection": {"kind": "map_elites", "descriptors": [
        {"name": "nodes", "bins": [2, 3]}, {"name": "llm_calls_per_input", "bins": [1.5, 4]}]}},
    "pareto": {"selection": {"kind": "pareto"}},
    "fixed": {"operator_policy": {"kind": "fixed"}},  # the default is the operator bandit
    "novelty": {"novelty_threshold": 0.9},
    # which instruction with which demos: MIPROv2-style search against the two operators it combines
    "prompt_ops": {"operators": [{"name": "bootstrap_demos"}, {"name": "reflective_rewrite"}]},
    "instruction_demo_search": {"operators": [{"name": "instruction_demo_search"}]},
}
DEFAULT_ARMS = ("islands", "dgm", "map_elites", "pareto", "fixed")  # novelty: --arms
EXTRA_OPERATORS = ("decompose", "best_of_n", "reflexion_retry")
DEFAULT_TASKS = ("examples/arithmetic/task.yaml", "examples/chained_ops/task.yaml")
VAL = 16  # val inputs per candidate: a small CPU's budget buys twice the children of the tasks' 32
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
MARK = "ARM-RESULT "


def spec_for(task: str, arm: str, seed: int, budget: int, out: str, val: int = VAL) -> Any:
    """The task as ``arm`` searches it: no RL, the budget as the stop, the shared operators,
    a val split of ``val`` inputs (half of them the cascade's minibatch)."""
    from evoagent import runner
    from evoagent.spec.config import RunSpec

    d = runner.prepare(task, output=out).model_dump(mode="json")
    d["seed"] = seed
    d["task"]["splits"]["val"] = val
    d["evolve"]["cascade"]["minibatch"] = max(1, val // 2)
    d["rl"]["enabled"] = False
    ops = d["evolve"]["operators"]
    ops += [{"name": n, "weight": 1.0} for n in EXTRA_OPERATORS if n not in {o["name"] for o in ops}]
    d["evolve"] |= {"generations": 50, "max_calls": budget}
    for key, value in ARMS[arm].items():
        d["evolve"][key] = {**d["evolve"][key], **value} if isinstance(value, dict) else value
    return RunSpec.model_validate(d)


def run_arm(task: str, arm: str, seed: int, budget: int, val: int) -> dict[str, Any]:
    from evoagent.archive.store import Archive

    out = tempfile.mkdtemp(prefix="evoagent-search-compare-")
    try:
        spec = spec_for(task, arm, seed, budget, out, val)
        figures = run_search(spec)
        with Archive(spec.run_dir, write=False) as a:
            evaluated = {e.agent_id for e in a.evaluations()}
            statuses = [r.status for r in a.agents()]
        return {"seed": seed, "val": figures["val"], "test": figures["test"], "calls": figures["calls"],
                "tokens": figures["tokens"], "wall_s": figures["wall_s"], "generations": figures["generations"],
                "distinct_evaluated": len(evaluated),
                "statuses": {s: statuses.count(s) for s in sorted(set(statuses))}}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def partial(name: str) -> Path:
    """Where the finished runs of an unfinished benchmark ``name`` are kept."""
    return RESULTS / f"{name}.partial.jsonl"


def spawn(task: str, arm: str, seed: int, budget: int, val: int, name: str) -> dict[str, Any]:
    """One run in its own process; finished runs are kept in ``partial(name)`` (one JSON line
    each), so an interrupted benchmark started again with the same settings skips them."""
    key = {"task": Path(task).parent.name, "arm": arm, "seed": seed, "budget": budget, "val": val}
    cmd = [sys.executable, __file__, "--one", task, arm, str(seed), "--budget", str(budget), "--val", str(val)]
    return run_kept(cmd, MARK, f"{key['task']} / {arm} / seed {seed} (budget {budget} calls)", key, partial(name),
                    tail=1500)


def mean_ci(xs: list[float]) -> tuple[float, list[float]]:
    """The mean and its 95% t-interval (a point for a single run)."""
    m = float(np.mean(xs))
    if len(xs) < 2:
        return m, [m, m]
    half = T95.get(len(xs) - 1, 1.96) * float(np.std(xs, ddof=1)) / len(xs) ** 0.5
    return m, [round(m - half, 4), round(m + half, 4)]


def run_arms(task: str, arms: list[str], seeds: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Every arm's runs on ``task``, summarized with the budget each seed's run was given; with
    ``args.match_budget`` the arms after the first get what the first arm spent, seed by seed."""
    given = dict.fromkeys(seeds, args.budget)
    out = {}
    for arm in arms:
        runs = [spawn(task, arm, s, given[s], args.val, args.name) for s in seeds]
        out[arm] = summarize(runs) | {"budgets": [given[s] for s in seeds]}
        if args.match_budget and arm == arms[0]:
            given = {s: int(r["calls"]) for s, r in zip(seeds, runs, strict=True)}
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    val, val_ci = mean_ci([r["val"] for r in runs])
    test, test_ci = mean_ci([r["test"] for r in runs])
    return {"val": round(val, 4), "val_ci": val_ci, "test": round(test, 4), "test_ci": test_ci,
            "distinct_evaluated": float(np.mean([r["distinct_evaluated"] for r in runs])),
            "calls": float(np.mean([r["calls"] for r in runs])), "runs": runs}


def markdown(figures: dict[str, Any]) -> str:
    matched = " (the first arm's; the others get what it spent, per seed)" if figures.get("match_budget") else ""
    lines = [f"Budget {figures['budget']} model completions per run{matched}, {figures['val']} val inputs, "
             f"seeds {figures['seeds']} "
             f"(mean, 95% t-interval over seeds); `{figures['command']}`", "",
             "| task | arm | best val | test | distinct agents evaluated | budget per seed | calls |",
             "|---|---|---|---|---|---|---|"]
    for task, t in figures["tasks"].items():
        for arm, a in t["arms"].items():
            budgets = ", ".join(map(str, a.get("budgets", [figures["budget"]])))
            lines.append(f"| {task} | {arm} | {a['val']:.3f} [{a['val_ci'][0]:.3f}, {a['val_ci'][1]:.3f}] | "
                         f"{a['test']:.3f} [{a['test_ci'][0]:.3f}, {a['test_ci'][1]:.3f}] | "
                         f"{a['distinct_evaluated']:.1f} | {budgets} | {a['calls']:.0f} |")
    v = figures["versions"]
    lines += ["", "Versions: " + ", ".join(f"{k} {v[k]}" for k in sorted(v))]
    return "\n".join(lines) + "\n"


def draw(figures: dict[str, Any], name: str) -> Path:
    """``bench/results/<name>.html``: per task, each arm's best val and test score with
    its 95% interval (hover: distinct agents evaluated, calls). Self-contained (plotly.js
    embedded, so it opens offline; ignored by git for its size)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    tasks = list(figures["tasks"])
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=tasks, shared_yaxes=True)
    for col, task in enumerate(tasks, start=1):
        arms = figures["tasks"][task]["arms"]
        for key, colour in (("val", "#1f77b4"), ("test", "#d62728")):
            mean = [a[key] for a in arms.values()]
            fig.add_trace(go.Scatter(
                x=list(arms), y=mean, mode="markers", name=f"best {key}" if key == "val" else "test of the best",
                marker={"color": colour, "size": 10}, legendgroup=key, showlegend=col == 1,
                error_y={"type": "data", "symmetric": False,
                         "array": [a[f"{key}_ci"][1] - m for a, m in zip(arms.values(), mean)],
                         "arrayminus": [m - a[f"{key}_ci"][0] for a, m in zip(arms.values(), mean)]},
                customdata=[[a["distinct_evaluated"], a["calls"]] for a in arms.values()],
                hovertemplate="%{x}: %{y:.3f}<br>%{customdata[0]:.1f} distinct agents, %{customdata[1]:.0f} calls",
            ), row=1, col=col)
    fig.update_yaxes(range=[0, 1], title_text="score (mean over seeds, 95% t-interval)", row=1, col=1)
    fig.update_layout(title=f"Search strategies at {figures['budget']} model completions per run, "
                            f"seeds {figures['seeds']}", height=480)
    dest = RESULTS / f"{name}.html"
    fig.write_html(str(dest), include_plotlyjs=True, full_html=True)
    print(f"wrote {dest}")
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--budget", type=int, default=240)
    ap.add_argument("--val", type=int, default=VAL)
    ap.add_argument("--name", default="search_compare", help="the results files' name")
    ap.add_argument("--match-budget", action="store_true",
                    help="the arms after the first get, per seed, what the first arm spent")
    ap.add_argument("--draw", action="store_true", help="only redraw <name>.html from <name>.json")
    ap.add_argument("--one", nargs=3, metavar=("TASK", "ARM", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.draw:
        draw(json.loads((RESULTS / f"{args.name}.json").read_text()), args.name)
        return
    if args.one:
        task, arm, seed = args.one
        print(MARK + json.dumps(run_arm(task, arm, int(seed), args.budget, args.val)), flush=True)
        return
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        sys.exit(f"--arms: unknown {unknown}; known: {list(ARMS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    start = time.perf_counter()
    tasks: dict[str, Any] = {}
    for task in args.tasks.split(","):
        name = Path(task).parent.name
        tasks[name] = {"arms": run_arms(task, arms, seeds, args)}
    command = "python bench/search_compare.py" + "".join(
        f" --{k} {v}" for k, v in (("tasks", args.tasks), ("arms", args.arms), ("seeds", args.seeds),
                                   ("budget", args.budget), ("val", args.val), ("name", args.name))
        if v != ap.get_default(k)) + (" --match-budget" if args.match_budget else "")
    figures = {"budget": args.budget, "match_budget": args.match_budget, "val": args.val, "seeds": seeds, "command": command, "machine": f"{os.cpu_count()} cores",
               "wall_s": round(time.perf_counter() - start, 1), "versions": cells.package_versions(("evoagent-ml", "gepa", "trl", "transformers", "torch")), "tasks": tasks}
    inputs = tuple(Path(t).resolve().parent for t in args.tasks.split(",")) + (ROOT / "graphs",)
    write_results(args.name, figures, inputs=inputs)
    (RESULTS / f"{args.name}.md").write_text(markdown(figures))
    draw(figures, args.name)
    partial(args.name).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
