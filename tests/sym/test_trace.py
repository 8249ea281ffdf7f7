"""Tracing straight-line arithmetic on symbolic dims (sym/trace.py): a traced result evaluates, at every binding of
the symbols, to what the same arithmetic on ints gives; any branch on a traced dim raises instead of silently
picking one side for every key."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynshape.errors import ShapeError
from dynshape.sym import sym
from dynshape.sym.trace import traced, untraced

A, B = sym("a", 0), sym("b", 1)
OPS = ["+", "-", "*", "//", "%", "r+", "r-", "r*", "r//", "r%"]


def _apply(op: str, x, y):
    if op.startswith("r"):
        x, y, op = y, x, op[1:]
    return {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "//": lambda: x // y,
            "%": lambda: x % y}[op]()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(1, 9), st.booleans()), min_size=1, max_size=6),
       st.integers(0, 50), st.integers(1, 50))
def test_traced_arithmetic_evaluates_as_ints(program, a, b):
    """A chain of +, -, *, //, % between a traced value, constants and the other symbol, then evaluated at a
    binding: equal to the chain run on ints (division only by positive constants or b >= 1)."""
    t, v = traced(A), a
    for op, c, with_b in program:
        operand_t, operand_v = (traced(B), b) if with_b else (c, c)
        if op in ("r//", "r%"):  # the traced side is the divisor: only b or a constant may divide
            continue
        t, v = _apply(op, t, operand_t), _apply(op, v, operand_v)
    e = untraced(t)
    got = e if type(e) is int else e.evaluate({"a": a, "b": b})
    assert got == v


def test_math_prod_and_mixed_ints_trace():
    shape = (2, traced(A), 3, traced(B))
    e = untraced(math.prod(shape[1:]) * 4 + 8)
    assert e.evaluate({"a": 5, "b": 7}) == 5 * 3 * 7 * 4 + 8
    assert untraced(traced(2) * 3) == 6  # an int stays an int


@pytest.mark.parametrize("branch", [
    lambda d: d == 0, lambda d: d != 1, lambda d: d < 3, lambda d: d >= 3, lambda d: bool(d), lambda d: int(d),
    lambda d: [0, 1][d], lambda d: hash(d), lambda d: max(d, 1), lambda d: -d, lambda d: d / 2])
def test_every_branch_on_a_traced_dim_raises(branch):
    with pytest.raises((ShapeError, TypeError)):
        branch(traced(A) + 1)


def test_a_result_that_is_not_an_integer_raises():
    with pytest.raises(ShapeError):
        untraced(1.5)
    with pytest.raises(ShapeError):
        traced(A) * 1.5  # a float meets a traced dim
