"""Symbolic dims as Python source: what the runtime compiles its per-call shape functions from.

Python's // and % are floor-based, like ours, so the text evaluates to exactly `e.evaluate(env)`, without
walking the expression per call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dynshape.sym.expr import DimLike, OpAtom, Symbol


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
