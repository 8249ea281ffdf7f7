"""Numpy broadcasting over symbolic shapes, and anonymous dims.

A symbolic dim is never assumed to be 1 (no 0/1 specialisation): two dims meet either because they are
provably equal, one is provably 1, or the caller unifies them (records that they are equal).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from dynshape.errors import ShapeError
from dynshape.sym import Expr, eq, prove, sym
from dynshape.sym.expr import OpAtom

_anon = itertools.count()


def any_dim(min: int = 1, max: int | None = None) -> Expr:
    """A fresh anonymous dimension (TVM's Any): it agrees with nothing unless unified."""
    return sym(f"?{next(_anon)}", min=min, max=max)


def _is_one(d) -> bool:
    return d == 1 if isinstance(d, int) else prove(eq(d, 1)) is True


def unclamped(d: int | Expr) -> int | Expr:
    """`d` without an outer max(0, e): what a Slice's length max(0, n - 1) becomes where it meets e."""
    if isinstance(d, Expr) and d.is_atom():
        a = d.atom()
        if isinstance(a, OpAtom) and a.op == "max" and len(a.args) == 2:
            x, y = a.args
            if isinstance(y, int) and y == 0:
                return x
            if isinstance(x, int) and x == 0:
                return y
    return d


def same_dim(a: int | Expr, b: int | Expr) -> bool:
    """Whether two dims of existing tensors are equal: the same expression, or e and max(0, e), which agree
    since a tensor's dim is >= 0 (wav2vec2's positional conv, sliced by one, added to its input: without
    this the Add's operands were not provably the same shape and it ran in numpy)."""
    return a == b or unclamped(a) == unclamped(b)


def broadcast_shapes(*shapes: tuple, unify: Callable | None = None) -> tuple:
    """Numpy broadcast of symbolic shapes. `unify(a, b) -> dim` resolves two dims that must be equal
    but are not provably so; without it such a pair is a ShapeError."""
    if unify is True or unify is False:
        raise ShapeError("broadcast_shapes(unify=...) takes a function (a, b) -> dim that records a == b, "
                         "e.g. lambda a, b: store.equate(a, b, 'where'); or None to refuse undecided pairs")
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        res = 1
        for d in dims:
            if _is_one(d):
                continue
            if isinstance(res, int) and res == 1:
                res = d
                continue
            if same_dim(res, d):
                res = unclamped(res)
                continue
            if isinstance(res, int) and isinstance(d, int):
                raise ShapeError(f"cannot broadcast shapes {_fmt(shapes)}: axis {axis - rank} has {res} and {d}")
            if prove(eq(res, d)) is True:
                continue
            if prove(eq(res, d)) is False and unify is None:
                raise ShapeError(f"cannot broadcast shapes {_fmt(shapes)}: axis {axis - rank} has {res} and {d}, "
                                 "which are never equal")
            if unify is None:
                raise ShapeError(f"cannot broadcast shapes {_fmt(shapes)}: axis {axis - rank} has {res} and {d}, "
                                 f"not provably equal; declare them equal (unify) or make one of them 1")
            res = unify(res, d)
        out.append(res)
    return tuple(out)


def _fmt(shapes) -> str:
    return ", ".join("(" + ", ".join(str(d) for d in s) + ("," if len(s) == 1 else "") + ")" for s in shapes)
