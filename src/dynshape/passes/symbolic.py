"""Shape arithmetic compiled away, and what is left alive.

Exporters compute shapes at run time (Shape -> Gather -> Concat -> Reshape, Range, ConstantOfShape). Inference
already knows those values as expressions of the input symbols (`TensorType.value`), so here they become one
compiled function of the call's key (`SymbolicValues`), and the nodes that computed them are dead code. The
rest is liveness: the nodes some graph output needs, given what is already known (constants and symbolic
values), including the values a subgraph (If / Loop / Scan body) reads from its enclosing graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import numpy as np

from dynshape.errors import ConstraintViolation
from dynshape.ir.graph import Graph, Node
from dynshape.ir.types import TensorType
from dynshape.sym import Expr, Symbol, substitute
from dynshape.sym.pysource import compile_key_function, key_names, to_py


@dataclass(frozen=True)
class SymbolicValues:
    """`fn(key) -> {value name: array}` for every value whose content follows from the symbols alone; `names`
    are those it computes (probed once at the symbols' lower bounds)."""

    fn: Callable[[tuple], dict[str, np.ndarray]]
    names: frozenset[str]
    deps: Mapping[str, frozenset] = dataclasses.field(default_factory=dict)  # value -> the symbols it reads
    # (symbols, fn) per set of symbols some values read: `only`'s functions, each computing just those values
    parts: tuple = ()

    def __call__(self, key: tuple) -> dict[str, np.ndarray]:
        return _values_at(self.fn, key)

    def only(self, key: tuple, changed: Collection[str]) -> dict[str, np.ndarray]:
        """The values that read a symbol in `changed`, at `key` (the others are as at a key that differs from this
        one in `changed` alone). Why: a bucket plan moved along a decode loop changes two of GPT-2's step's three
        symbols, and making all 25 of its values cost ~40 us a token, most of them read from the last key's."""
        out: dict[str, np.ndarray] = {}
        for symbols, fn in self.parts:
            if not symbols.isdisjoint(changed):
                out.update(_values_at(fn, key))
        return out


def _values_at(fn: Callable[[tuple], dict[str, np.ndarray]], key: tuple) -> dict[str, np.ndarray]:
    """fn(key), refusing a value the shapes give that its integer type cannot hold (an int32 size past 2**31 - 1):
    numpy would wrap it, and the shapes inferred from it would no longer hold."""
    try:
        return fn(key)
    except OverflowError as e:
        raise ConstraintViolation(f"at key {key} a value computed from the input shapes does not fit its integer "
                                  f"type ({e}): the model's shape arithmetic overflows for these inputs") from None


def value_items_py(t: object, names: Mapping[str, str]) -> list[str] | None:
    """Python source for each element of a value inference knows from the symbols alone (a TensorType whose
    `value` is a static-shape array of integers and expressions of the symbols in `names`), flat, in order; None for
    any other value. What `symbolic_values` compiles, and what a bucket plan's lean move writes (runtime/rekey.py)."""
    if not isinstance(t, TensorType) or t.value is None or t.value.dtype != object:
        return None
    if any(isinstance(d, Expr) for d in t.value.shape):
        return None
    flat = list(t.value.reshape(-1))
    if not all(isinstance(v, (int, np.integer, Expr)) for v in flat):
        return None
    if any(isinstance(v, Expr) and not v.free_symbols <= names.keys() for v in flat):
        return None
    return [to_py(v, names) if isinstance(v, Expr) else str(int(v)) for v in flat]


def symbolic_values(graph: Graph, symbols: list[Symbol], only: Collection[str] | None = None) -> SymbolicValues:
    """Compile one function computing every value inference knows as an expression of `symbols` (of those in
    `only`, when given: a build computes per key just what its steps read; GPT-2's step read 24 of 120, and
    making the other 96 arrays cost ~70 us per new key)."""
    names = key_names([s.name for s in symbols])
    exprs = []
    deps: dict[str, frozenset] = {}
    for name, t in sorted(graph.types.items()):
        if only is not None and name not in only:
            continue
        items = value_items_py(t, names)
        if items is None:
            continue
        deps[name] = frozenset().union(*(v.free_symbols for v in t.value.reshape(-1) if isinstance(v, Expr)))
        items = ", ".join(items)
        exprs.append((deps[name], f"out[{name!r}] = _np.array([{items}], dtype=_np.{np.dtype(t.dtype).name})"
                                  f".reshape({tuple(t.value.shape)!r})"))

    def compiled(lines: list[str]) -> Callable[[tuple], dict[str, np.ndarray]]:
        body = "out = {}\n" + "\n".join(lines) + "\nreturn out"
        return compile_key_function("symvals", list(names), body, {"_np": np})

    fn = compiled([line for _, line in exprs])
    probe = tuple(max(s.lo, 1) for s in symbols)
    try:
        computed = frozenset(fn(probe))
    except Exception:  # noqa: BLE001 - a probe failure just means "compute at run time instead"
        computed = frozenset()
    groups: dict[frozenset, list[str]] = {}
    for used, line in exprs:
        groups.setdefault(used, []).append(line)
    parts = tuple((used, compiled(lines)) for used, lines in groups.items() if used) if computed else ()
    return SymbolicValues(fn, computed, {k: v for k, v in deps.items() if k in computed}, parts)


def live_nodes(graph: Graph, known: set[str]) -> tuple[list[Node], set[str]]:
    """The nodes some graph output needs (in order), and every value they read; values in `known` need no
    producer. A node with subgraphs also needs what its bodies read from this graph."""
    needed = {v.name for v in graph.outputs}
    live = []
    for node in reversed(graph.nodes):
        outs = [o for o in node.outputs if o]
        if any(o in needed and o not in known for o in outs):
            live.append(node)
            needed.update(x for x in node.inputs if x)
            needed.update(node.free_names())
    return list(reversed(live)), needed


def specialized(graph: Graph, mapping: Mapping[str, int | Expr]) -> Graph:
    """The graph with symbols replaced by values (static variants) or narrower symbols (buckets)."""
    types = {}
    for name, t in graph.types.items():
        if isinstance(t, TensorType) and any(isinstance(d, Expr) for d in t.shape):
            t = TensorType(t.dtype, tuple(substitute(d, mapping) if isinstance(d, Expr) else d for d in t.shape),
                           t.value)
        types[name] = t
    return dataclasses.replace(graph, types=types)
