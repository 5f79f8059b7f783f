"""bench/failures.py: which failures each row fixed, grouped by what the test questions are."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import failures  # noqa: E402

from evoagent.tasks.datasets import Example  # noqa: E402


def example(i: int, expression: str, answer: str) -> Example:
    entry = {"question": f"Calculate {expression}.", "answer": answer,
             "metadata": {"source_dataset": "basic_arithmetic", "source_index": i, "expression": expression,
                          "num_terms": 2, "num_digits": 1, "difficulty": {"num_terms": [2, 2]}}}
    return Example(f"q{i}", entry["question"], answer, {"entry": entry, "rg": "basic_arithmetic"})


def test_features_read_the_answer_and_the_expression_and_skip_bookkeeping():
    assert failures.features(example(0, "2 + -1", "1")) == {
        "answer": "1 digit", "operators": "+", "negative operand": "yes", "num_terms": "2", "num_digits": "1"}
    assert failures.features(example(1, "4 - 1 - 7", "-4"))["operators"] == "-"
    assert failures.features(example(1, "4 - 1 - 7", "-4"))["negative operand"] == "no"
    assert failures.features(example(2, "9 * 8", "72"))["answer"] == "2 digits"
    assert failures.features(Example("x", "What is pi?", "3.14")) == {"answer": "not an integer"}


def test_the_profile_says_which_kind_of_failure_each_half_fixed():
    """Evolve fixes the products, RL the negative answers, joint both: the table shows it per
    value, summed over two seeds, and drops the features that never vary."""
    ex = [example(0, "9 * 8", "72"), example(1, "7 * 6", "42"), example(2, "1 - 5", "-4"),
          example(3, "2 - 9", "-7"), example(4, "1 + 2", "3")]
    wrong_but = lambda *right: {"per_input": {e.id: float(e.id in right or e.id == "q4") for e in ex}}  # noqa: E731
    rows = {"seed": {0: wrong_but(), 1: wrong_but()},
            "evolve": {0: wrong_but("q0", "q1"), 1: wrong_but("q0")},
            "rl": {0: wrong_but("q2", "q3"), 1: wrong_but("q2", "q0")},
            "joint": {0: wrong_but("q0", "q1", "q2", "q3"), 1: wrong_but("q0", "q1", "q2")}}
    prof = failures.profile(ex, rows)
    assert set(prof) == {"answer", "operators"}  # num_terms, num_digits and negative operands never vary
    assert prof["operators"]["*"] == {"inputs": 4, "seed wrong": 4, "evolve": 3, "rl": 1, "joint": 4, "evolve+rl": 1}
    assert prof["operators"]["-"] == {"inputs": 4, "seed wrong": 4, "evolve": 0, "rl": 3, "joint": 3, "evolve+rl": 0}
    assert prof["answer"]["1 digit"] == {"inputs": 2, "seed wrong": 0, "evolve": 0, "rl": 0, "joint": 0, "evolve+rl": 0}
    table = failures.markdown("t", prof)
    assert "| feature | value | inputs | seed wrong | evolve | rl | joint | evolve+rl |" in table
    assert "| operators | * | 4 | 4 | 3 | 1 | 4 | 1 |" in table
    assert "| answer | negative | 4 | 4 | 0 | 3 | 3 | 0 |" in table


def test_the_profile_counts_whichever_rows_ran_and_only_their_common_seeds():
    """GEPA may be the row joint must beat: it gets its column; a half that did not run gets
    none (and no evolve+rl), and a seed that one row lacks is left out."""
    ex = [example(0, "9 * 8", "72"), example(1, "1 - 5", "-4")]
    cell = lambda *right: {"per_input": {e.id: float(e.id in right) for e in ex}}  # noqa: E731
    rows = {"seed": {0: cell(), 1: cell()}, "gepa": {0: cell("q0"), 1: cell("q0")}, "joint": {0: cell("q1")}}
    prof = failures.profile(ex, rows)
    assert prof["operators"]["*"] == {"inputs": 1, "seed wrong": 1, "gepa": 1, "joint": 0}
    assert prof["operators"]["-"] == {"inputs": 1, "seed wrong": 1, "gepa": 0, "joint": 1}


def test_a_cell_scored_on_other_questions_is_refused():
    """The summary draws the test split again: cells that ran on other data must not be told
    by this checkout's questions."""
    ex = [example(0, "9 * 8", "72"), example(1, "1 - 5", "-4")]
    rows = {r: {0: {"per_input": {"q0": 0.0, "elsewhere": 0.0}}} for r in ("seed", "evolve", "rl", "joint")}
    with pytest.raises(SystemExit, match="'elsewhere' of seed 0 is not in the task's test split"):
        failures.profile(ex, rows)
