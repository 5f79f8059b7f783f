"""Which tasks could the joint loop win? Screen reasoning-gym tasks for failures that split:
some fixed by the program search, others only by training the weights.

Per candidate task (a reasoning-gym generator with its own scorer, data no one here wrote), on
the embedded SmolLM2-135M-Instruct with the `direct` seed agent and no tool, one run seed:

1. ``seed``: the seed agent scored on the screening inputs (the test split, 128 inputs). A level
   of the generator's options is kept when the seed scores between 0.05 and 0.5 there;
   otherwise, when the seed scored above 0.5, the next (harder) level is tried, up to the
   candidate's last; a level too hard already ends the ladder.
2. ``evolve`` (program search alone) and ``rl`` (GRPO phases alone, ``evolve.children: 0``) at
   the same budget of model completions, each testing its best agent on the same inputs.

From the per-input outcomes: the inputs each half fixes (the seed wrong, the half right), their
overlap, and ``union - max``: what joint could add over the better half if the two halves'
fixes added up. The tasks ranked by it are the headline's candidates.

Each (task level, row) is a cell (``bench/cells.py``): its own process and results file under
``bench/results/split_screen/``, so a stopped screen resumes where it was. The screening
inputs come from run seed 100, never one of the headline's seeds (0, 1, 2).

    python bench/split_screen.py            # run the missing cells, then write the summary
    python bench/split_screen.py --plan     # done and missing cells
    python bench/split_screen.py --summarize  # split_screen.json/.md from the cells, at their commit
    python bench/split_screen.py --screened gcd-L0 > screened.jsonl  # a later task's splits.exclude
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cells
from failures import fixes
from results_io import RESULTS

ROOT = Path(__file__).resolve().parents[1]
FOLDER = RESULTS / "split_screen"
SEED = 100
BUDGET = 1000  # completions per half
LOW, HIGH = 0.05, 0.5
SCREEN = 128  # screening inputs (the test split of these runs)

# name -> (generator, description, levels of its options, easiest first)
CANDIDATES: dict[str, tuple[str, str, list[dict[str, Any]]]] = {
    "leg_counting": ("leg_counting", "Count the legs of the animals listed. The answer is one whole number.",
                     [{"min_animals": 1, "max_animals": 2, "max_instances": 2},
                      {"min_animals": 2, "max_animals": 3, "max_instances": 3}]),
    "chain_sum3": ("chain_sum", "Add and subtract three one-digit numbers. The answer is one integer.",
                   [{"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}]),
    "chain_sum4": ("chain_sum", "Add and subtract four one-digit numbers. The answer is one integer.",
                   [{"min_terms": 4, "max_terms": 4, "min_digits": 1, "max_digits": 1}]),
    "basic_arithmetic": ("basic_arithmetic", "Compute a product, sum or difference of two one-digit "
                         "numbers. The answer is one integer.",
                         [{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                           "operators": ["+", "-", "*"]}]),
    "decimal_chain_sum": ("decimal_chain_sum", "Add and subtract two one-digit numbers with one "
                          "decimal place. The answer is one number.",
                          [{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                            "min_decimal_places": 1, "max_decimal_places": 1}]),
    "products": ("products", "Multiply a two-digit number by a one-digit number. The answer is one "
                 "whole number.", [{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}]),
    "letter_counting": ("letter_counting", "Count how many times a letter appears in a short text. "
                        "The answer is one whole number.",
                        [{"min_words": 3, "max_words": 5}, {"min_words": 5, "max_words": 10}]),
    "gcd": ("gcd", "Find the greatest common divisor of two whole numbers. The answer is one whole "
            "number.", [{"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 30}]),
    "lcm": ("lcm", "Find the least common multiple of two whole numbers. The answer is one whole "
            "number.", [{"min_numbers": 2, "max_numbers": 2, "min_value": 2, "max_value": 20}]),
    "count_bits": ("count_bits", "Count the 1 bits in a number's binary representation. The answer "
                   "is one whole number.", [{"min_n": 1, "max_n": 1023}]),
}

TASK = """name: {name}
seed: {seed}
task:
  description: {description}
  dataset: {{kind: reasoning_gym, name: {generator}, size: 800, options: {options}}}
  splits: {{train: 64, val: 32, test: {screen}}}
  reward: {{kind: reasoning_gym, extract: last_number}}
graphs: [{root}/graphs/direct.yaml]
policy: {{max_batch: 64}}
evolve:
  generations: {generations}
  children: {children}
  max_calls: {budget}
  operators:
    - {{name: bootstrap_demos}}
    - {{name: reflective_rewrite, weight: 2}}
    - {{name: add_node}}
    - {{name: param_search}}
    - {{name: best_of_n}}
    - {{name: decompose}}
  cascade: {{minibatch: 16, threshold: 0.0}}
rl: {{enabled: {rl}, every: 1, algorithm: grpo, group_size: 8, inputs_per_step: 8, steps: 4,
      lr: 1.0e-4, oversample: 2}}
"""


def write_task(candidate: str, level: int, row: str, out: Path) -> Path:
    """The task.yaml of one row of one candidate level (``row``: seed, evolve or rl)."""
    generator, description, levels = CANDIDATES[candidate]
    text = TASK.format(
        name=f"{candidate}-L{level}-{row}", seed=SEED, description=json.dumps(description),
        generator=generator, options=json.dumps(levels[level]), screen=SCREEN, root=ROOT,
        generations={"seed": 0, "evolve": 200, "rl": 200}[row], children=0 if row == "rl" else 4,
        budget=BUDGET, rl="true" if row == "rl" else "false",
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "task.yaml").write_text(text)
    return out / "task.yaml"


def run_cell(cell: cells.Cell) -> dict[str, Any]:
    """One cell in this process; a killed run resumes from its archive."""
    from headline import run_search

    from evoagent.check import check_spec
    from evoagent.spec import load_spec

    candidate, level = cell.task.rsplit("-L", 1)
    work = cells.work_dir("split_screen") / cell.task / cell.row
    spec = load_spec(write_task(candidate, int(level), cell.row, work))
    spec = spec.model_copy(update={"output": str(work / "runs")})
    check_spec(spec)
    return run_search(spec)


def screened(key: str, work: Path) -> list[str]:
    """The screening questions of a candidate level (``gcd-L0``): what a later test split of
    that task must not hold (``task.splits.exclude``). Drawn as the screen drew them; no model."""
    from evoagent.spec import load_spec
    from evoagent.tasks.datasets import task_data

    candidate, level = key.rsplit("-L", 1)
    spec = load_spec(write_task(candidate, int(level), "seed", work))
    return [e.input for e in task_data(spec.task, spec.seed, Path(spec.base_dir))[1]["test"]]


def summarize(got: dict[cells.Cell, dict[str, Any]], chosen: dict[str, str]) -> dict[str, Any]:
    """Per candidate (at its kept level): the three scores, each half's fixes and their overlap."""
    tasks = {}
    for candidate, key in chosen.items():
        seed, evolve, rl = (got[cells.Cell(key, row, SEED)]["per_input"] for row in ("seed", "evolve", "rl"))
        n, level = len(seed), int(key.rsplit("-L", 1)[1])
        fe, fr = fixes(seed, evolve), fixes(seed, rl)
        union, best = len(fe | fr), max(len(fe), len(fr))
        tasks[candidate] = {
            "level": level, "options": CANDIDATES[candidate][2][level],
            "inputs": n,
            "seed": round(sum(seed.values()) / n, 3), "evolve": round(sum(evolve.values()) / n, 3),
            "rl": round(sum(rl.values()) / n, 3),
            "evolve_fixes": len(fe), "rl_fixes": len(fr), "both_fix": len(fe & fr),
            "union_minus_max": union - best, "union_minus_max_share": round((union - best) / n, 3),
            "calls": {row: got[cells.Cell(key, row, SEED)]["calls"] for row in ("evolve", "rl")},
        }
    ranked = sorted(tasks, key=lambda t: (-tasks[t]["union_minus_max"], t))
    return {"seed": SEED, "budget": BUDGET, "screen_inputs": SCREEN, "band": [LOW, HIGH],
            "tasks": tasks, "ranked": ranked, "chosen": ranked[:3]}


def markdown(figures: dict[str, Any]) -> str:
    lines = ["| task | level | seed | evolve | RL | evolve fixes | RL fixes | both | union - max |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in figures["ranked"]:
        t = figures["tasks"][name]
        lines.append(f"| {name} | {t['level']} | {t['seed']:.3f} | {t['evolve']:.3f} | {t['rl']:.3f} | "
                     f"{t['evolve_fixes']} | {t['rl_fixes']} | {t['both_fix']} | {t['union_minus_max']} |")
    out = [k for k in figures.get("probes", {}) if k.rsplit("-L", 1)[0] not in figures["tasks"]]
    if out:
        lines += ["", "Left out (the seed outside 0.05-0.5 at every level tried): " + ", ".join(
            f"{k} {figures['probes'][k]:.3f}" for k in out) + "."]
    lines += ["", f"Chosen for the headline: {', '.join(figures['chosen'])}; "
              f"{figures['screen_inputs']} screening inputs, {figures['budget']} completions per half, "
              f"cells at commit {figures['commit'][:10]}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--results", type=Path, default=FOLDER)
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--summarize", action="store_true",
                    help="write split_screen.json/.md beside --results from the cells, running none")
    ap.add_argument("--commit", help="with --summarize: the campaign's commit (default: the newest a done cell ran at)")
    ap.add_argument("--screened", metavar="KEY",
                    help="print a candidate level's screening questions (KEY such as gcd-L0) as the JSONL "
                         "a later task's splits.exclude reads, and stop")
    ap.add_argument("--cell", nargs=2, metavar=("TASK", "ROW"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    sys.path.insert(0, str(Path(__file__).parent))
    if args.screened:
        with tempfile.TemporaryDirectory() as work:
            for question in screened(args.screened, Path(work)):
                print(json.dumps({"question": question}))
        return
    if args.cell:
        cell = cells.Cell(args.cell[0], args.cell[1], SEED)
        start = time.perf_counter()
        result = run_cell(cell)
        command = "python bench/split_screen.py " + " ".join(sys.argv[1:])
        print("wrote", cells.write(args.results, cell, result, command, time.perf_counter() - start))
        return
    names = [c for c in args.candidates.split(",") if c]
    if unknown := [c for c in names if c not in CANDIDATES]:
        sys.exit(f"--candidates: unknown {unknown}; known: {sorted(CANDIDATES)}")
    if args.summarize:
        every = [cells.Cell(f"{n}-L{lv}", r, SEED) for n in names for lv in range(len(CANDIDATES[n][2]))
                 for r in ("seed", "evolve", "rl")]
        at = cells.summary_commit(args.commit, args.results, every)
        get = lambda cell: cells.gather(args.results, [cell], at)[cell]  # noqa: E731
    else:
        head, dirty = cells.commit()
        get = lambda cell: screen(args, cell, head, dirty)  # noqa: E731
    chosen: dict[str, str] = {}
    probes: dict[str, float] = {}  # every level tried: the seed's score there
    for name in names:
        for level in range(len(CANDIDATES[name][2])):
            key = f"{name}-L{level}"
            seed = get(cells.Cell(key, "seed", SEED))
            score = probes[key] = round(sum(seed["per_input"].values()) / len(seed["per_input"]), 3)
            print(f"{key}: the seed scores {score:.3f} on the {SCREEN} screening inputs", flush=True)
            if LOW <= score <= HIGH:
                chosen[name] = key
                break
            if score < LOW:  # the levels only get harder from here
                print(f"{name}: too hard at level {level}; left out", flush=True)
                break
        else:
            print(f"{name}: no level puts the seed between {LOW} and {HIGH}; left out", flush=True)
    if args.plan:
        grid = [cells.Cell(k, r, SEED) for k in chosen.values() for r in ("evolve", "rl")]
        print(cells.plan(args.results, grid, None, lambda c: 600.0).describe())
        return
    got = {}
    for key in chosen.values():
        for row in ("seed", "evolve", "rl"):
            got[cells.Cell(key, row, SEED)] = get(cells.Cell(key, row, SEED))
    tried = [cells.Cell(key, "seed", SEED) for key in probes]
    at = next(iter(got.values()))["commit"] if got else cells.commit()[0]
    figures = summarize(got, chosen) | {"commit": at, "probes": probes}
    used = sorted(set(tried) | set(got))
    cells.write_summary(args.results.parent / "split_screen.json", figures, args.results, used, at, Path(__file__))
    (args.results.parent / "split_screen.md").write_text(markdown(figures))
    print(markdown(figures))


def screen(args: argparse.Namespace, cell: cells.Cell, head: str, dirty: bool) -> dict[str, Any]:
    """A cell's result: kept from an earlier run at this commit, else run now in its own process
    (under ``--plan``, a missing seed cell is still run: the level depends on it)."""
    kept = cells.read(args.results, cell)
    if kept is not None and kept["commit"] == head:
        return kept
    return cells.spawn(args.results, cell, [__file__, "--results", str(args.results), "--cell", cell.task, cell.row])


if __name__ == "__main__":
    main()
