"""The ``calculator`` tool: find the first arithmetic expression in free text and evaluate it.

Small models rarely pass a bare expression; they write "What is 12 plus 5? 12 + 5". So the
tool scans the argument for the first run of numbers and operators that parses as arithmetic
with at least one binary operator, and evaluates it with ``ast`` (numbers, + - * / // % **,
unary +/-, parentheses; nothing else is ever evaluated). ``x``/``×`` between numbers mean
``*``, ``÷`` means ``/`` and ``^`` means ``**``.

Limits: an exponent above 100 in absolute value, or any value above 1e100, is rejected so a
prompt cannot make the process compute a huge number.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable

from evoagent.tools.base import ToolContext, ToolResult, register_tool

MAX_EXPONENT = 100
MAX_ABS = 1e100

Number = int | float

_BINOPS: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARYOPS: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_TIMES_X = re.compile(r"(?<=[\d)])\s*[xX]\s*(?=[\d(])")
_CANDIDATE = re.compile(r"[\d.\s+\-*/%()]+")
_JUXTAPOSED = re.compile(r"(?<=[\d)])\s+(?=[\d(])")
_LEAD_JUNK = re.compile(r"^(?:[\s+*/%]|\.(?!\d))+")  # keep a leading "-" or ".5"
_TAIL_JUNK = re.compile(r"[\s+\-*/%.]+$")  # dangling operators, sentence-ending "."


def evaluate(expression: str) -> Number:
    """Evaluate a bare arithmetic expression; raise ValueError for anything else.

    ZeroDivisionError propagates for division or modulo by zero.
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    return _eval(tree.body)


def find_expression(text: str) -> str | None:
    """Return the first arithmetic expression with a binary operator in ``text``, normalized."""
    text = text.replace("×", "*").replace("÷", "/").replace("^", "**").replace("−", "-")
    text = _TIMES_X.sub(" * ", text)
    for match in _CANDIDATE.finditer(text):
        # "12 5 + 3": two numbers with only space between cannot be one expression; split there.
        for piece in _JUXTAPOSED.split(match.group()):
            expr = _trim(piece)
            if expr and _has_binop(expr):
                return expr
    return None


def format_number(value: Number) -> str:
    """Format integers as "17" and other numbers with up to 6 decimals, zeros stripped."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    if abs(value) >= 1e16 or abs(value) < 1e-6:
        return f"{value:.6g}"
    return f"{value:.6f}".rstrip("0").rstrip(".")


@register_tool
class Calculator:
    """Evaluates the first arithmetic expression found in its argument."""

    name = "calculator"
    description = "evaluates an arithmetic expression, e.g. 12 * (3 + 4)"

    async def __call__(self, argument: str, ctx: ToolContext) -> ToolResult:
        expr = find_expression(argument)
        if expr is None:
            return ToolResult("", ok=False, error=f"no arithmetic expression in {argument[:80]!r}")
        try:
            value = evaluate(expr)
        except ZeroDivisionError:
            return ToolResult("", ok=False, error=f"division by zero in {expr!r}")
        except (ValueError, OverflowError) as exc:
            return ToolResult("", ok=False, error=str(exc))
        return ToolResult(format_number(value))


def _eval(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"not a number: {value!r}")
        return _checked(value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARYOPS:
        return _checked(_UNARYOPS[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} exceeds {MAX_EXPONENT}")
        result = _BINOPS[type(node.op)](left, right)
        if isinstance(result, complex):
            raise ValueError("result is not a real number")
        return _checked(result)
    raise ValueError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")


def _checked(value: Number) -> Number:
    if value != value or abs(value) > MAX_ABS:  # NaN or too large
        raise ValueError(f"value too large (limit {MAX_ABS:g})")
    return value


def _has_binop(expr: str) -> bool:
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return False
    return any(isinstance(n, ast.BinOp) for n in ast.walk(tree))


def _trim(raw: str) -> str:
    """Strip sentence punctuation, dangling operators and unmatched parentheses."""
    expr, prev = raw, None
    while prev != expr:
        prev = expr
        expr = _TAIL_JUNK.sub("", _LEAD_JUNK.sub("", _drop_unmatched(expr)))
    # Python rejects leading zeros ("007"); read them as decimal numbers.
    return re.sub(r"(?<![\d.])0+(?=\d)", "", expr)


def _drop_unmatched(expr: str) -> str:
    keep = [True] * len(expr)
    stack: list[int] = []
    for i, ch in enumerate(expr):
        if ch == "(":
            stack.append(i)
        elif ch == ")":
            if stack:
                stack.pop()
            else:
                keep[i] = False
    for i in stack:
        keep[i] = False
    return "".join(ch for ch, k in zip(expr, keep) if k)
