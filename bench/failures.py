"""Which failures each row fixed, told by the questions: a campaign's per-input outcomes
grouped by what the test questions are (the answer's form, the expression's operators, the
generator's own difficulty fields).

The headline's goal is that joint beats each half; where it does not, its README must say
which failures each half fixed and why the fixes did not add up. Counts of fixed inputs say
how much; this says which: for instance that evolve-only fixed the products and RL-only the
negative answers. The features come from the example itself (reasoning-gym keeps each
question's ``metadata``), so they hold for any generator; a feature with one value on the
whole test split says nothing and is left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evoagent.tasks.datasets import Example

HALVES = ("evolve", "rl")
# the metadata fields of reasoning-gym's entries that are bookkeeping, not what the question is
SKIP = frozenset({"source_dataset", "source_index", "difficulty", "expression"})
OPERATOR = re.compile(r"(?<=\s)[-+*/](?=\s)")
NEGATIVE_OPERAND = re.compile(r"(?:^|[\s(])-\d")
Runs = Mapping[str, Mapping[int, Mapping[str, Any]]]  # row -> run seed -> that row's result


def fixes(seed: Mapping[str, float], row: Mapping[str, float]) -> set[str]:
    """Inputs the seed got wrong and ``row`` got right (a reward of 1)."""
    return {i for i, r in row.items() if r >= 1.0 and seed.get(i, 0.0) < 1.0}


def fix_sets(rows: Runs) -> dict[str, int]:
    """Summed over seeds, from the per-input outcomes: the inputs each half fixed against the
    seed row (evolve, rl), both, ``union - max`` (what joint could add over the better half if
    the halves' fixes added up), how many of the union and of the rest joint fixed, and the
    inputs joint broke (the seed right, joint wrong). Why joint did or did not add up."""
    out = dict.fromkeys(("evolve", "rl", "both", "union_minus_max", "joint_of_union", "joint_other",
                         "joint_broke"), 0)
    for seed in rows["seed"]:
        base = rows["seed"][seed]["per_input"]
        fe, fr = fixes(base, rows["evolve"][seed]["per_input"]), fixes(base, rows["rl"][seed]["per_input"])
        joint = rows["joint"][seed]["per_input"]
        fj = fixes(base, joint)
        union = fe | fr
        out["evolve"] += len(fe)
        out["rl"] += len(fr)
        out["both"] += len(fe & fr)
        out["union_minus_max"] += len(union) - max(len(fe), len(fr))
        out["joint_of_union"] += len(fj & union)
        out["joint_other"] += len(fj - union)
        out["joint_broke"] += sum(1 for i, r in base.items() if r >= 1.0 and joint.get(i, 0.0) < 1.0)
    return out


def answer_form(answer: str) -> str:
    """An integer answer by its sign and digits (the model's failures often follow them)."""
    a = answer.strip()
    if not re.fullmatch(r"-?\d+", a):
        return "not an integer"
    return "negative" if a.startswith("-") else f"{len(a)} digit{'s' if len(a) > 1 else ''}"


def features(example: Example) -> dict[str, str]:
    """What the question is, by field: its answer's form; for a generator that keeps the
    expression, its operators and whether an operand is negative; and the generator's other
    scalar metadata (``num_terms``, ``num_digits``, ...)."""
    out = {"answer": answer_form(example.answer)}
    meta = example.meta.get("entry", {}).get("metadata", {}) if isinstance(example.meta.get("entry"), Mapping) else {}
    if isinstance(expr := meta.get("expression"), str):
        out["operators"] = " ".join(sorted(set(OPERATOR.findall(expr)))) or "none"
        out["negative operand"] = "yes" if NEGATIVE_OPERAND.search(expr) else "no"
    for key, value in meta.items():
        if key not in SKIP and isinstance(value, (int, float, str, bool)) and len(str(value)) <= 20:
            out[key] = str(value)
    return out


def profile(examples: Iterable[Example], rows: Runs) -> dict[str, dict[str, dict[str, int]]]:
    """Per feature and value, summed over seeds: the test inputs, those the seed row got wrong
    (``seed wrong``), and of those the ones each other row got right, in ``rows``' order, then
    the ones both halves did (``evolve+rl``, where both ran). ``rows`` is row -> seed -> a
    cell's result (its ``per_input`` rewards, 1 meaning right), the ``seed`` row among them;
    only the seeds every row has count. Features whose value is the same on every input are
    left out."""
    by_id = {e.id: features(e) for e in examples}
    others = [r for r in rows if r != "seed"]
    both = set(HALVES) <= set(others)
    seeds = sorted(set.intersection(*(set(runs) for runs in rows.values())))
    out: dict[str, dict[str, dict[str, int]]] = {}
    for seed in seeds:
        base = rows["seed"][seed]["per_input"]
        fixed = {r: fixes(base, rows[r][seed]["per_input"]) for r in others}
        for input_id in base:
            if input_id not in by_id:
                raise SystemExit(f"test input {input_id!r} of seed {seed} is not in the task's test split: "
                                 "the cells ran on other data than this checkout draws")
            for feature, value in by_id[input_id].items():
                c = out.setdefault(feature, {}).setdefault(value, dict.fromkeys(
                    ("inputs", "seed wrong", *others, *(["evolve+rl"] if both else [])), 0))
                c["inputs"] += 1
                if base[input_id] >= 1.0:
                    continue
                c["seed wrong"] += 1
                for r in others:
                    c[r] += int(input_id in fixed[r])
                if both:
                    c["evolve+rl"] += int(all(input_id in fixed[h] for h in HALVES))
    return {f: dict(sorted(v.items())) for f, v in sorted(out.items()) if len(v) > 1}


def markdown(task: str, prof: Mapping[str, Mapping[str, Mapping[str, int]]]) -> list[str]:
    """``profile`` as a table: one line per feature value, one column per count."""
    if not prof:
        return []
    columns = list(next(iter(next(iter(prof.values())).values())))
    lines = [f"Which of {task}'s failures each row fixed (test inputs summed over seeds; a fix: the seed "
             "agent wrong, the row right):", "",
             "| feature | value | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for feature, values in prof.items():
        for value, c in values.items():
            lines.append(f"| {feature} | {value} | " + " | ".join(str(c[k]) for k in columns) + " |")
    return [*lines, ""]
