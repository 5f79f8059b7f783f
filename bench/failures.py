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


def profile(examples: Iterable[Example], rows: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> dict[str, dict[str, dict[str, int]]]:
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
        outcome = {r: runs[seed]["per_input"] for r, runs in rows.items()}
        for input_id, base in outcome["seed"].items():
            if input_id not in by_id:
                raise SystemExit(f"test input {input_id!r} of seed {seed} is not in the task's test split: "
                                 "the cells ran on other data than this checkout draws")
            right = {r: outcome[r].get(input_id, 0.0) >= 1.0 for r in rows}
            for feature, value in by_id[input_id].items():
                c = out.setdefault(feature, {}).setdefault(value, dict.fromkeys(
                    ("inputs", "seed wrong", *others, *(["evolve+rl"] if both else [])), 0))
                c["inputs"] += 1
                if right["seed"]:
                    continue
                c["seed wrong"] += 1
                for r in others:
                    c[r] += int(right[r])
                if both:
                    c["evolve+rl"] += int(all(right[h] for h in HALVES))
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
