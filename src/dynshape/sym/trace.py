"""Tracing straight-line integer arithmetic on symbolic dims: a function of shapes run once on `Traced` dims
returns its results as canonical expressions, or raises where it would branch on a dim.

Why: a bucket plan (runtime/rekey.py) rewrites a native step's table words at every new key from the key's shapes;
where those words are plain arithmetic on the shapes (a Concat's row bytes), one compiled function of the key
computes them all. An `Expr` compares structurally (`==` is canonical equality), so a function testing
`dim == 0` on it would silently take one branch for every key; a `Traced` dim refuses every comparison, truth
test and conversion to int instead, so whatever traces without raising is the same arithmetic at every key.
"""

from __future__ import annotations

from typing import Any

from dynshape.errors import ShapeError
from dynshape.sym.expr import Expr


class Traced:
    """A symbolic dim under tracing: +, -, *, // and % give Traced (or int where the result is constant); any
    comparison, hashing, truth test or int conversion raises ShapeError."""

    __slots__ = ("expr",)

    def __init__(self, expr: Expr) -> None:
        self.expr = expr

    @staticmethod
    def _wrap(e: Any) -> Any:
        return Traced(e) if isinstance(e, Expr) else e

    def __add__(self, o: Any) -> Any:
        return self._wrap(self.expr + untraced(o))

    def __radd__(self, o: Any) -> Any:
        return self._wrap(untraced(o) + self.expr)

    def __sub__(self, o: Any) -> Any:
        return self._wrap(self.expr - untraced(o))

    def __rsub__(self, o: Any) -> Any:
        return self._wrap(untraced(o) - self.expr)

    def __mul__(self, o: Any) -> Any:
        return self._wrap(self.expr * untraced(o))

    def __rmul__(self, o: Any) -> Any:
        return self._wrap(untraced(o) * self.expr)

    def __floordiv__(self, o: Any) -> Any:
        return self._wrap(self.expr // untraced(o))

    def __rfloordiv__(self, o: Any) -> Any:
        return self._wrap(untraced(o) // self.expr)

    def __mod__(self, o: Any) -> Any:
        return self._wrap(self.expr % untraced(o))

    def __rmod__(self, o: Any) -> Any:
        return self._wrap(untraced(o) % self.expr)

    def _refuse(self, *_: Any) -> Any:
        raise ShapeError(f"traced arithmetic branches on the symbolic dim {self.expr}")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse  # type: ignore[assignment]
    __bool__ = __index__ = __int__ = __hash__ = __neg__ = __abs__ = __pow__ = _refuse  # type: ignore[assignment]


def traced(d: Any) -> Any:
    """A dim as tracing takes it: a symbolic one as Traced, an int as itself."""
    return Traced(d) if isinstance(d, Expr) else d


def untraced(v: Any) -> Any:
    """A traced value (a result, or an operand meeting a traced dim) as an int or an Expr; anything else (a float,
    a string, a tuple) raises ShapeError."""
    if isinstance(v, Traced):
        return v.expr
    if type(v) is int:
        return v
    raise ShapeError(f"a traced value is a {type(v).__name__}, not an integer")
