"""Specialisation on input symbols whose values fix a rank.

ONNX lets a model read a shape or an axes list from an input (`Reshape(x, shape)` with `shape` fed at run
time): the output *rank* is then the length of that input, a dim of the caller's choosing. dynshape's types
have static ranks, so inference stops at the first such node (`InferCtx.static`) and records the symbols in
`graph.rank_symbols`. Running the graph binds them from the inputs, and `specialize` re-infers a copy of the
graph with exactly those symbols fixed (every other dim stays symbolic). Variants are cached per graph; past
`MAX_VARIANTS` distinct values the oldest is dropped (a reference executor rebuilds cheaply; a compiled
executable applies its own documented limit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dynshape.errors import ConstraintViolation, ShapeError
from dynshape.ir.graph import Graph, Node, Value
from dynshape.sym import Expr, solve, substitute

MAX_VARIANTS = 32


def rank_values(graph: Graph, inputs: Mapping[str, Any]) -> dict[str, int]:
    """The values of `graph.rank_symbols` that `inputs` imply (from the declared input shapes). An input that
    carries one of them must be there (its absence is named, not reported as a missing value); nested lists count
    by their shape, as the binder converts them."""
    obs: list = []
    for v in graph.inputs:
        carries = v.shape is not None and any(isinstance(d, Expr) and d.free_symbols & graph.rank_symbols.keys()
                                              for d in v.shape)
        x = inputs.get(v.name)
        if x is None and carries:
            raise ConstraintViolation(f"missing input {v.name!r}: its shape fixes a rank "
                                      f"({'; '.join(graph.rank_symbols.values())})")
        if v.kind != "tensor" or v.shape is None or x is None:
            continue
        try:
            shape = tuple(np.shape(x))
        except ValueError:  # a ragged list: the binder names it
            continue
        if len(shape) != len(v.shape):
            raise ConstraintViolation(f"input {v.name!r} has rank {len(shape)} (shape {shape}), "
                                      f"expected rank {len(v.shape)}")
        for axis, (d, n) in enumerate(zip(v.shape, shape)):
            if isinstance(d, Expr) and d.free_symbols & graph.rank_symbols.keys():
                obs.append((d, int(n), f"input {v.name!r} axis {axis}"))
    env = solve(obs) if obs else {}
    missing = sorted(set(graph.rank_symbols) - env.keys())
    if missing:
        raise ConstraintViolation(f"no input shape gives the value of {', '.join(missing)}, which fixes a rank "
                                  f"({graph.rank_symbols[missing[0]]})")
    return {n: env[n] for n in sorted(graph.rank_symbols)}


def variant_for(graph: Graph, inputs: Mapping[str, Any]) -> Graph:
    """The cached specialisation of `graph` for the rank symbols' values in `inputs` (built on first sight)."""
    if not isinstance(inputs, Mapping):
        raise ConstraintViolation(f"inputs must be a dict name -> array, got {type(inputs).__name__}")
    values = rank_values(graph, inputs)
    key = tuple(values.items())
    g = graph.variants.pop(key, None)
    if g is None:
        g = specialize(graph, values)
        while len(graph.variants) >= MAX_VARIANTS:
            graph.variants.pop(next(iter(graph.variants)))
    graph.variants[key] = g  # most recently used last
    return g


def static_variant(graph: Graph, env: Mapping[str, int]) -> Graph:
    """The graph specialised to every input symbol's value (cached like `variant_for`): used for inputs that
    break an assumption the generic graph made (a symbolic Reshape entry that is 0, see `InferCtx.assume`)."""
    values = {n: int(env[n]) for n in sorted(graph.signature.symbols) if n in env}
    key = ("static", *values.items())
    g = graph.variants.pop(key, None)
    if g is None:
        g = specialize(graph, values)
        if any(f.kind == "assume" for f in g.signature.facts if f.check is not None):
            raise ConstraintViolation(f"a graph specialised to {values} still assumes something these inputs "
                                      "break (dynshape bug)")
        while len(graph.variants) >= MAX_VARIANTS:
            graph.variants.pop(next(iter(graph.variants)))
    graph.variants[key] = g
    return g


def specialize(graph: Graph, values: Mapping[str, Any]) -> Graph:
    """A copy of `graph` (initializers shared) with the input symbols in `values` fixed (or replaced by the
    narrower symbol given), re-inferred.

    Inputs that do not fit the model at these values (a length the op refuses, a rank mismatch) give a
    `ConstraintViolation` naming the values, as any other bad input does."""
    from dynshape.ir.infer import infer_graph

    clone = clone_structure(graph)
    clone.inputs = [_fix(v, values) for v in graph.inputs]
    try:
        return infer_graph(clone)
    except ShapeError as e:
        at = ", ".join(f"{k} = {v}" for k, v in values.items())
        raise ConstraintViolation(f"the inputs give {at}, which fixes a rank, and the model does not admit "
                                  f"it: {e}") from None


def nonempty(graph: Graph, names: list[str]) -> Graph:
    """A copy of `graph` re-inferred with each named input symbol narrowed from min 0 to min 1 (its max and
    divisibility kept): what a build for the keys where none of them is 0 starts from.

    Why: an undeclared dim ranges over [0, inf] (ONNX admits empty tensors), and under that range inference must
    write a broadcast as `max(a, b) * min(a, b, 1)` and cannot prove the facts kernels need, so whole chains run
    outside kernels. The keys with a 0 are rare and served by another build (`runtime.executable`)."""
    from dynshape.sym import sym

    atoms = {s.atom().name: s.atom() for s in graph.signature.symbols.values() if hasattr(s, "atom")}
    narrowed = {n: sym(n, 1, atoms[n].hi, atoms[n].mult) for n in names}
    g = specialize(graph, narrowed)
    his = implied_upper_bounds(g, [n for n in names if atoms[n].hi is None])
    if not his:
        return g
    return specialize(graph, {**narrowed, **{n: sym(n, 1, hi, atoms[n].mult) for n, hi in his.items()}})


def implied_upper_bounds(graph: Graph, names: list[str]) -> dict[str, int]:
    """Upper bounds on unbounded input symbols that the graph's own broadcast requirements imply.

    A BERT export adds rows 0..seq of a 512-row position table to the (batch, seq) embeddings: inference records
    `min(512, seq) == seq or one of them is 1`, which every valid input meets and the binder checks. For seq >= 1
    that already means seq <= 512; knowing it lets `min(512, seq)` simplify to `seq`, so the sum and what follows
    are kernels as when the user declares the bound. A bound is taken only when it is proved: with
    seq = K + 1 + u (u >= 0, K the other side's upper bound) neither `a == b` nor `a == 1` nor `b == 1` can hold."""
    from dynshape.sym import Symbol, bounds, eq, prove, substitute, sym

    out: dict[str, int] = {}
    over = sym("__over", 0)
    for f in graph.signature.facts:
        a, b = getattr(f.check, "a", None), getattr(f.check, "b", None)
        if f.kind != "require" or a is None or b is None:
            continue
        for s, other in ((a, b), (b, a)):
            if not (isinstance(s, Expr) and s.is_atom() and isinstance(s.atom(), Symbol) and s.atom().name in names):
                continue
            hi = bounds(other)[1] if isinstance(other, Expr) else other
            name = s.atom().name
            if hi is None or name in out and out[name] <= hi:
                continue
            beyond = {name: hi + 1 + over}
            a2, b2 = (substitute(x, beyond) if isinstance(x, Expr) else x for x in (a, b))
            if all(prove(eq(x, y)) is False for x, y in ((a2, b2), (a2, 1), (b2, 1))):
                out[name] = int(hi)
    return out


def _fix(v: Value, values: Mapping[str, int]) -> Value:
    if v.shape is None:
        return v
    shape = tuple(substitute(d, {k: n for k, n in values.items() if k in d.free_symbols})
                  if isinstance(d, Expr) else d for d in v.shape)
    return Value(v.name, v.dtype, shape, v.kind)


def clone_structure(graph: Graph) -> Graph:
    """The graph's structure without inferred types: nodes and subgraphs copied, arrays shared."""
    nodes = [Node(n.op_type, n.domain, n.name, {k: _clone_attr(a) for k, a in n.attrs.items()}, list(n.inputs),
                  list(n.outputs)) for n in graph.nodes]
    return Graph(graph.name, list(graph.inputs), [Value(v.name, v.dtype, v.shape, v.kind) for v in graph.outputs],
                 nodes, dict(graph.initializers), {}, opset_imports=dict(graph.opset_imports),
                 requires=list(graph.requires))


def _clone_attr(a: Any) -> Any:
    if isinstance(a, Graph):
        return clone_structure(a)
    if isinstance(a, list) and any(isinstance(g, Graph) for g in a):
        return [clone_structure(g) if isinstance(g, Graph) else g for g in a]
    return a

