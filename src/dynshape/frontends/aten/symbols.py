"""PyTorch's symbolic sizes (sympy expressions of a ShapeEnv) as dynshape expressions.

Each sympy symbol becomes one named `dynshape.sym` symbol with the range torch proved for it; every size of
every tensor, every SymInt argument (`operator.mul(s0, s1)`, `sym_size`) is then an exact `int | Expr`, so
shapes stay symbolic all the way into dynshape's inference instead of becoming run-time Shape arithmetic.

Nothing here imports torch at module level: sympy objects are recognised by their class names, so the module
loads (and the rest of dynshape works) where torch is not installed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynshape.errors import ModelError
from dynshape.sym import Expr, ceil_div, is_expr, max_, min_, sym


class Unsupported(ModelError):
    """Something the torch frontend cannot express (an op, an argument, a symbolic form)."""


@dataclass
class SymbolTable:
    """sympy symbol name -> dynshape expression, with where each came from (for errors and explain()).

    `subs` maps dynshape symbol names to ints or expressions: converting a graph under it gives the graph
    with those symbols fixed (how a batch-1 graph is recognised as an earlier graph with batch = 1).
    """

    symbols: dict[str, Any] = field(default_factory=dict)  # sympy name -> dynshape Expr (or int under subs)
    sources: dict[str, list[str]] = field(default_factory=dict)  # dynshape name -> source descriptions
    torch_ranges: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # dynshape name -> torch's
    subs: dict[str, Any] = field(default_factory=dict)

    def declare(self, torch_name: str, name: str, lo: int, hi: int | None, sources: list[str],
                torch_range: tuple[int, int | None] | None = None) -> Any:
        """A dynshape symbol for torch's `torch_name` (min lo, max hi); returns it (substituted if fixed)."""
        e = sym(name, min=max(0, lo), max=hi)
        self.sources[name] = list(sources)
        self.torch_ranges[name] = torch_range or (lo, hi)
        if name in self.subs:
            e = self.subs[name]
        self.symbols[torch_name] = e
        return e

    def named(self) -> dict[str, Any]:
        """dynshape name -> symbol expression, for the symbols not fixed by `subs`."""
        out = {}
        for e in self.symbols.values():
            if is_expr(e):
                for s in e.symbols:
                    out.setdefault(s.name, Expr.from_atom(s))
        return out


def symbol_name(source: str, used: set[str]) -> str:
    """A readable, unique identifier for a size source: `L['x'].size()[0]` -> `x_0`,
    `L['kwargs']['ids'].size()[1]` -> `ids_1`, `L['inputs'][1].size()[2]` -> `inputs_1_2`."""
    s = re.sub(r"^L\[(['\"])kwargs\1\]", "L", source)  # **kwargs of forward: name after the keyword
    s = re.sub(r"\.size\(\)\[(\d+)\]", r"_\1", s)
    s = re.sub(r"\.stride\(\)\[(\d+)\]", r"_stride\1", s)
    s = re.sub(r"^[LG]\[(['\"])(.*?)\1\]", r"\2", s)
    s = re.sub(r"\[(['\"])(.*?)\1\]", r"_\2", s)
    s = re.sub(r"\[(\d+)\]", r"_\1", s)
    s = s.replace("._modules", "").replace("._parameters", "").replace("._buffers", "")
    s = re.sub(r"\W+", "_", s).strip("_") or "s"
    if s[0].isdigit():
        s = "s_" + s
    name, k = s, 1
    while name in used:
        k += 1
        name = f"{s}__{k}"
    used.add(name)
    return name


def to_expr(e: Any, table: SymbolTable, what: str = "a size") -> Any:
    """A sympy integer expression (or int / SymInt) as `int | Expr`; `Unsupported` for forms dynshape lacks."""
    if isinstance(e, bool):
        return int(e)
    if isinstance(e, int):
        return e
    node = getattr(e, "node", None)  # torch.SymInt
    if node is not None and hasattr(node, "expr"):
        hint = _maybe_int(e)
        if hint is not None and not _is_symbolic(node):
            return hint
        return to_expr(_replaced(node), table, what)
    return _convert(e, table, what)


def _is_symbolic(node: Any) -> bool:
    try:
        return bool(node.expr.free_symbols)
    except Exception:  # pragma: no cover - a node without a sympy expr
        return True


def _maybe_int(e: Any) -> int | None:
    try:
        from torch.fx.experimental.symbolic_shapes import is_concrete_int

        if is_concrete_int(e):
            return int(e)
    except Exception:  # pragma: no cover
        return None
    return None


def _replaced(node: Any) -> Any:
    """The SymInt's expression with the ShapeEnv's replacements (s1 -> s0 after a guard s0 == s1) applied."""
    expr = node.expr
    env = getattr(node, "shape_env", None)
    if env is not None:
        try:
            expr = env.replace(expr)
        except Exception:  # pragma: no cover - keep the raw expression
            pass
    return expr


def _convert(e: Any, table: SymbolTable, what: str) -> Any:
    cls = type(e).__name__
    args = getattr(e, "args", ())
    if getattr(e, "is_Integer", False):
        return int(e)
    if getattr(e, "is_Symbol", False):
        name = str(e)
        if name not in table.symbols:
            raise Unsupported(f"{what} uses the symbol {name}, which no input size, SymInt argument or "
                              "declared dimension defines (a data-dependent size?)")
        return table.symbols[name]
    if getattr(e, "is_Rational", False) and not getattr(e, "is_Integer", False):
        raise Unsupported(f"{what} is the non-integer {e}")
    conv: Callable[[Any], Any] = lambda x: _convert(x, table, what)  # noqa: E731
    if cls == "Add":
        out: Any = 0
        for a in args:
            out = out + conv(a)
        return out
    if cls == "Mul":
        out = 1
        for a in args:
            out = out * conv(a)
        return out
    if cls == "Pow":
        base, exp = args
        if getattr(exp, "is_Integer", False) and int(exp) >= 0:
            return conv(base) ** int(exp)
    if cls in ("FloorDiv", "CleanDiv", "IntTrueDiv_floor"):
        return conv(args[0]) // conv(args[1])
    if cls in ("CeilDiv",):
        return ceil_div(conv(args[0]), conv(args[1]))
    if cls in ("Mod", "PythonMod"):
        return conv(args[0]) % conv(args[1])
    if cls in ("Max", "Min"):
        return functools.reduce(max_ if cls == "Max" else min_, [conv(a) for a in args])
    if cls == "CeilToInt" and args and type(args[0]).__name__ == "IntTrueDiv":
        num, den = args[0].args
        return ceil_div(conv(num), conv(den))
    raise Unsupported(f"{what} is the symbolic expression {e} ({cls}), which dynshape cannot represent")


def range_of(vr: Any) -> tuple[int, int | None]:
    """torch's ValueRanges as (lo, hi | None) over integers >= 0."""
    lo, hi = getattr(vr, "lower", 0), getattr(vr, "upper", None)
    lo_i = _finite(lo)
    hi_i = _finite(hi)
    return (0 if lo_i is None else max(0, lo_i)), hi_i


def _finite(x: Any) -> int | None:
    try:
        if x is None or str(x) in ("oo", "-oo", "int_oo", "-int_oo") or getattr(x, "is_infinite", False):
            return None
        return int(x)
    except (TypeError, ValueError, OverflowError):
        return None


def condition(e: Any, table: SymbolTable, what: str) -> Any:
    """A sympy relational (a guard, a runtime assert) as a dynshape condition, True/False when decided."""
    from dynshape.sym import eq, ne

    cls = type(e).__name__
    if getattr(e, "is_Boolean", False) and cls in ("BooleanTrue", "BooleanFalse"):
        return cls == "BooleanTrue"
    args = getattr(e, "args", ())
    ops: Mapping[str, Callable[[Any, Any], Any]] = {
        "Equality": eq, "Unequality": ne,
        "LessThan": lambda a, b: _cmp(a, b, "le"), "StrictLessThan": lambda a, b: _cmp(a, b, "lt"),
        "GreaterThan": lambda a, b: _cmp(b, a, "le"), "StrictGreaterThan": lambda a, b: _cmp(b, a, "lt"),
    }
    if cls in ops and len(args) == 2:
        a, b = (to_expr(x, table, what) for x in args)
        return ops[cls](a, b)
    raise Unsupported(f"{what}: the condition {e} ({cls}) has no dynshape form")


def _cmp(a: Any, b: Any, kind: str) -> Any:
    from dynshape.sym import le, lt

    if isinstance(a, int) and isinstance(b, int):
        return a <= b if kind == "le" else a < b
    return le(a, b) if kind == "le" else lt(a, b)
