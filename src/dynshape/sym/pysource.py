"""Symbolic dims as Python source: what the runtime compiles its per-call shape functions from.

Python's // and % are floor-based, like ours, so the text evaluates to exactly `e.evaluate(env)`, without
walking the expression per call.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dynshape.errors import ShapeError
from dynshape.sym.expr import DimLike, Expr, OpAtom, Symbol

if TYPE_CHECKING:
    from dynshape.sym.cond import Cond


def to_py(e: DimLike, names: Mapping[str, str]) -> str:
    """Python source for e with each symbol renamed through `names`."""
    if isinstance(e, int):
        return f"({e})"
    parts = []
    for m, c in e.terms:
        parts.append("*".join([str(c)] + [_atom_py(a, names) for a in m]))
    if e.const:
        parts.append(str(e.const))
    return "(" + " + ".join(parts) + ")"


def _atom_py(a: Symbol | OpAtom, names: Mapping[str, str]) -> str:
    if isinstance(a, Symbol):
        return names[a.name]
    args = [to_py(x, names) for x in a.args]
    if a.op in ("min", "max"):
        return f"{a.op}({', '.join(args)})"
    return f"({args[0]} {'//' if a.op == 'fdiv' else '%'} {args[1]})"


def key_function(name: str, symbols: Sequence[str], body: str) -> str:
    """`def name(key):` unpacking the key tuple into s0, s1, ... (one per symbol), then `body` (indented)."""
    lines = [f"def {name}(key):"]
    if symbols:
        lines.append("    (" + "".join(f"s{i}, " for i in range(len(symbols))) + ") = key")
    lines += ["    " + ln for ln in body.splitlines()]
    return "\n".join(lines) + "\n"


def key_names(symbols: Sequence[str]) -> dict[str, str]:
    """Symbol name -> its variable in a `key_function` (s0, s1, ...)."""
    return {s: f"s{i}" for i, s in enumerate(symbols)}


def compile_key_function(name: str, symbols: Sequence[str], body: str, scope: dict | None = None):
    """Compile a `key_function` and return it (our own generated source, from canonical expressions)."""
    scope = dict(scope or {})
    exec(compile(key_function(name, symbols, body), f"<dynshape {name}>", "exec"), scope)  # noqa: S102
    return scope[name]


def from_py(text: str, symbols: Mapping[str, DimLike]) -> DimLike:
    """The expression `to_py` printed (with names mapping each symbol to itself), rebuilt from its text.

    Used where an expression must outlive the process (an artefact's extra facts). The text is parsed, never
    evaluated: only integers, the symbols named in `symbols`, + - * // % and min/max are accepted, so a
    tampered file can at worst be refused.
    """
    from dynshape.sym.rewrite import floordiv, max_, min_, mod

    def build(n: ast.AST) -> DimLike:
        if isinstance(n, ast.Constant) and isinstance(n.value, int) and not isinstance(n.value, bool):
            return n.value
        if isinstance(n, ast.Name) and n.id in symbols:
            return symbols[n.id]
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -build(n.operand)
        if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
            a, b = build(n.left), build(n.right)
            op = _BINOPS[type(n.op)]
            if op == "fdiv":
                return floordiv(a, b)
            if op == "mod":
                return mod(a, b)
            return a + b if op == "+" else a - b if op == "-" else a * b
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("min", "max")
                and len(n.args) >= 2 and not n.keywords):
            return (min_ if n.func.id == "min" else max_)(*(build(x) for x in n.args))
        raise ShapeError(f"not a dimension expression over {sorted(symbols)}: {text!r} ({ast.dump(n)[:60]})")

    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ShapeError(f"not a dimension expression: {text!r}") from None
    return build(tree.body)


_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "fdiv", ast.Mod: "mod"}



def cond_to_json(c: object) -> dict:
    """A sym condition as plain data (`cond_from_json` rebuilds it)."""
    expr = c.expr
    names = {s: s for s in (expr.free_symbols if isinstance(expr, Expr) else ())}
    return {"kind": c.kind, "expr": to_py(expr, names), "k": c.k, "text": c.text}


def cond_from_json(d: Mapping, symbols: Mapping[str, DimLike]) -> object:
    """The condition `cond_to_json` wrote, over `symbols` (name -> symbol expression)."""
    from dynshape.sym.cond import Cond

    if d.get("kind") not in ("ge", "eq", "ne", "div") or not isinstance(d.get("k", 0), int):
        raise ShapeError(f"not a dimension condition: {dict(d)!r}")
    return Cond(d["kind"], from_py(str(d["expr"]), symbols), str(d.get("text", "")), int(d.get("k", 0)))


_COND_TESTS = {"ge": "{e} >= 0", "eq": "{e} == 0", "ne": "{e} != 0", "div": "{e} % {k} == 0"}


def cond_to_py(c: Cond, names: dict[str, str]) -> str:
    """A sym condition as a Python boolean expression over a key function's variables (`key_names`)."""
    return _COND_TESTS[c.kind].format(e=to_py(c.expr, names), k=c.k)
