"""Symbolic dimensions: canonical integer expressions, ranges, divisibility, a sound prover, a solver."""

from __future__ import annotations

import sys
import types

from dynshape.errors import ShapeError
from dynshape.sym.bounds import bounds, divisor
from dynshape.sym.cond import Cond, divides, eq, le, lt, ne, prove
from dynshape.sym.expr import DimLike, Expr, OpAtom, Symbol, as_dim, as_int, is_expr
from dynshape.sym.rewrite import ceil_div, exact_quotient, floordiv, max_, min_, mod, simplify, substitute
from dynshape.sym.solve import check_symbol, solve


def _int_arg(x: object, what: str, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        try:
            import numpy as np

            if isinstance(x, np.integer):
                return int(x)
        except ImportError:  # pragma: no cover
            pass
        raise ShapeError(f"symbol {name!r}: {what} must be an integer, got {x!r}")
    return x


def make_symbol(name: str, min: int = 1, max: int | None = None, multiple_of: int = 1) -> Symbol:
    """Validate a declaration and return the Symbol atom (range normalised to multiples)."""
    if not isinstance(name, str) or not name:
        raise ShapeError(f"a symbol needs a non-empty string name, got {name!r}")
    lo = _int_arg(min, "min", name)
    hi = None if max is None else _int_arg(max, "max", name)
    k = _int_arg(multiple_of, "multiple_of", name)
    if lo < 0:
        raise ShapeError(f"symbol {name!r}: min={lo} is negative; dimensions are >= 0")
    if k < 1:
        raise ShapeError(f"symbol {name!r}: multiple_of={k} must be >= 1")
    if hi is not None and lo > hi:
        raise ShapeError(f"symbol {name!r}: min={lo} > max={hi}")
    lo_k = -(-lo // k) * k
    hi_k = None if hi is None else (hi // k) * k
    if hi_k is not None and lo_k > hi_k:
        raise ShapeError(f"symbol {name!r}: no multiple of {k} lies in [{lo}, {hi}]")
    return Symbol(name, lo_k, hi_k, k)


def sym(name: str, min: int = 1, max: int | None = None, multiple_of: int = 1) -> Expr:
    """A named symbolic dimension: an integer in [min, max] (max None = unbounded), a multiple of multiple_of."""
    return Expr.from_atom(make_symbol(name, min, max, multiple_of))


class _CallableModule(types.ModuleType):
    """`dynshape.sym` is this package and also the constructor: `ds.sym("batch", max=64)`."""

    def __call__(self, name: str, min: int = 1, max: int | None = None, multiple_of: int = 1) -> Expr:
        return sym(name, min, max, multiple_of)


sys.modules[__name__].__class__ = _CallableModule

__all__ = [
    "Cond", "DimLike", "Expr", "OpAtom", "Symbol", "as_dim", "as_int", "bounds", "ceil_div", "check_symbol",
    "divides", "divisor", "eq", "exact_quotient", "floordiv", "is_expr", "le", "lt", "make_symbol", "max_", "min_",
    "mod", "ne", "prove", "simplify", "solve", "substitute", "sym",
]
