"""Seeded one- and two-step arithmetic word problems for ``examples/arithmetic``.

Each problem is a short story around one operation chain ("Mia has 34 stickers. She buys 18
more. How many stickers does she have now?"). The numbers are two-digit, so SmolLM2-135M rarely
gets the sum right in its head, but the expression behind the story is short enough for it to
write down: the gain the search can find is to let a calculator do the arithmetic.

Used from task.yaml as ``dataset: {kind: python, ref: "word_problems:generate"}``; the task
file's folder is on the import path for its own modules.
"""

from __future__ import annotations

import random
from collections.abc import Callable

NAMES = ("Mia", "Noah", "Ava", "Liam", "Zoe", "Omar", "Lena", "Ravi", "Ines", "Kofi", "Yuki", "Sam")
ITEMS = ("apples", "stickers", "marbles", "books", "coins", "pencils", "stamps", "cards", "shells")
CONTAINERS = ("boxes", "bags", "jars", "crates", "packs")

Story = tuple[str, int]  # (text, answer)


def _add(rng: random.Random, who: str, item: str) -> Story:
    a, b = rng.randint(12, 89), rng.randint(12, 89)
    return f"{who} has {a} {item}. {who} buys {b} more. How many {item} does {who} have now?", a + b


def _sub(rng: random.Random, who: str, item: str) -> Story:
    a = rng.randint(40, 99)
    b = rng.randint(11, a - 10)
    return f"{who} had {a} {item} and gave {b} of them away. How many {item} are left?", a - b


def _mul(rng: random.Random, who: str, item: str) -> Story:
    n, k = rng.randint(3, 12), rng.randint(12, 48)
    box = rng.choice(CONTAINERS)
    return f"{who} has {n} {box} with {k} {item} in each. How many {item} is that in total?", n * k


def _div(rng: random.Random, who: str, item: str) -> Story:
    k, n = rng.randint(12, 45), rng.randint(3, 9)
    return (f"{who} shares {k * n} {item} equally among {n} friends. "
            f"How many {item} does each friend get?", k)


def _two_step(rng: random.Random, who: str, item: str) -> Story:
    a, b, c = rng.randint(20, 70), rng.randint(11, 40), rng.randint(5, 19)
    return (f"{who} starts with {a} {item}, finds {b} more and then loses {c}. "
            f"How many {item} does {who} have at the end?", a + b - c)


KINDS: dict[str, Callable[[random.Random, str, str], Story]] = {
    "add": _add, "sub": _sub, "mul": _mul, "div": _div, "two_step": _two_step,
}


def generate(seed: int, size: int, kinds: list[str] | None = None) -> list[dict[str, object]]:
    """``size`` problems drawn from ``kinds`` (default: all), the same for the same seed."""
    chosen = list(kinds or KINDS)
    unknown = sorted(set(chosen) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown problem kinds {unknown}; known: {sorted(KINDS)}")
    rng = random.Random(seed)
    rows = []
    for i in range(size):
        kind = chosen[i % len(chosen)]
        text, answer = KINDS[kind](rng, rng.choice(NAMES), rng.choice(ITEMS))
        rows.append({"id": f"{kind}-{i}", "input": text, "answer": str(answer), "kind": kind})
    return rows
