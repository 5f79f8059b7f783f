"""The calculator tool finds arithmetic inside prose and refuses anything that is not arithmetic."""

from __future__ import annotations

import asyncio

import pytest

from evoagent.tools import ToolContext, ToolResult, make_tool
from evoagent.tools.calculator import evaluate


def calc(text: str) -> ToolResult:
    return asyncio.run(make_tool("calculator")(text, ToolContext()))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What is 12 plus 5? 12 + 5", "17"),
        ("Tom has 3 apples and buys 4 more: 3 + 4", "7"),
        ("e.g. 12 * (3 + 4).", "84"),
        ("12 x 3", "36"),
        ("6 × 7", "42"),
        ("10 ÷ 4", "2.5"),
        ("7 // 2 and 7 % 2", "3"),
        ("2 ** 10", "1024"),
        ("1 / 3", "0.333333"),
        ("-3 * -3", "9"),
        ("(2 + 3) * (4 - 1)", "15"),
        ("4 / 2", "2"),
    ],
)
def test_finds_and_evaluates_the_first_expression(text: str, expected: str) -> None:
    result = calc(text)
    assert result == ToolResult(expected)


def test_description_is_one_line() -> None:
    tool = make_tool("calculator")
    assert tool.name == "calculator"
    assert "\n" not in tool.description and "12 * (3 + 4)" in tool.description


@pytest.mark.parametrize("text", ["__import__('os').system('ls')", "x + 1", "six apples", "", "42"])
def test_text_without_arithmetic_is_an_error(text: str) -> None:
    result = calc(text)
    assert not result.ok
    assert result.error is not None and result.error.startswith("no arithmetic expression in")


@pytest.mark.parametrize(
    "expr", ["__import__('os')", "abs(-1)", "x + 1", "[1] * 3", "'a' * 3", "True + 1"]
)
def test_evaluate_rejects_names_calls_and_non_numbers(expr: str) -> None:
    with pytest.raises(ValueError):
        evaluate(expr)


@pytest.mark.parametrize("text", ["2 ** 1000", "9 ** 9 ** 9", "10 ** 99 * 10 ** 99"])
def test_huge_numbers_are_rejected_quickly(text: str) -> None:
    result = calc(text)
    assert not result.ok and result.error


@pytest.mark.parametrize("text", ["1 / 0", "5 // 0", "5 % 0"])
def test_division_by_zero_is_an_error_not_an_exception(text: str) -> None:
    result = calc(text)
    assert not result.ok
    assert result.error is not None and "division by zero" in result.error
