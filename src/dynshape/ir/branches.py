"""Control flow decided by an input's value: the graph specialised to that value, its `If`s inlined.

Real exports branch on small inputs: a voice-activity model picks its front end by the sample rate it is fed
(`If(Equal(sr, 16000))`, three of them, the LSTM state going in and out). Run as written, every branch runs on
the interpreter, op by op, every call (25x slower than the same network without `If`). But such a condition
depends only on an input that takes a handful of values: specialised to one value, each condition is a constant,
each `If` is just its taken branch, and the whole graph compiles as one. `branch_inputs` finds those inputs;
`specialize_values` makes the copy for one value (the compiler builds one per value seen, `runtime.branch_variants`).

Exports also branch on shapes: torch's `x.squeeze(d)` under dynamic shapes becomes `If(Equal(Shape(x)[d], 1))`
with a Squeeze on one side and an Identity on the other (Silero VAD has three inside its sample-rate branches).
`shape_branches` finds the Ifs whose condition inference knows as a condition on the input symbols; the compiler
evaluates it per call (one generated comparison each) and builds the graph with each If replaced by the branch
that condition picks, one build per combination seen.

Only small inputs qualify (static shape, at most `MAX_ELEMENTS` integer or bool elements): a value that
changes every call (a float signal, a token) would make a build per call.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dynshape.ir.graph import Graph, Node, Value
from dynshape.ir.opdef import is_default_domain
from dynshape.sym import Cond, Expr, Symbol, eq

__all__ = ["MAX_ELEMENTS", "branch_inputs", "inline_constant_ifs", "shape_branches", "specialize_values",
           "symbol_sources"]

MAX_ELEMENTS = 8


def _small_int_input(v: Value) -> bool:
    if v.kind != "tensor" or v.shape is None or not all(isinstance(d, int) for d in v.shape):
        return False
    return np.dtype(v.dtype).kind in "biu" and int(np.prod(v.shape, dtype=np.int64)) <= MAX_ELEMENTS


def branch_inputs(graph: Graph) -> list[str]:
    """The small integer / bool inputs (in input order) that the condition of some top-level `If` depends on."""
    small = {v.name for v in graph.inputs if _small_int_input(v)}
    if not small:
        return []
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    found: set[str] = set()
    for n in graph.nodes:
        if n.op_type != "If" or not is_default_domain(n) or not n.inputs:
            continue
        stack, seen = [n.inputs[0]], set()
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if x in small:
                found.add(x)
            p = producer.get(x)
            if p is not None:
                stack += [i for i in (*p.inputs, *p.free_names()) if i]
    return [v.name for v in graph.inputs if v.name in found]


def specialize_values(graph: Graph, values: Mapping[str, np.ndarray], decided: Mapping[str, bool] | None = None
                      ) -> Graph:
    """A copy of `graph` (initializers shared) where the named inputs are constants with these values, each `If`
    named in `decided` (by its first output) replaced by the branch its truth value picks and every `If` whose
    condition is then known by its taken branch (repeatedly: a branch may hold another), re-inferred. The named
    inputs are no longer inputs of the copy."""
    from dynshape.ir.infer import infer_graph
    from dynshape.ir.specialize import clone_structure

    g = clone_structure(graph)
    g.inputs = [v for v in graph.inputs if v.name not in values]
    g.initializers.update({k: np.asarray(v) for k, v in values.items()})
    if decided:
        inline_constant_ifs(g, decided)
        g = clone_structure(g)
    infer_graph(g)
    for _ in range(16):  # nesting depth; each round inlines every If whose condition inference now knows
        if not inline_constant_ifs(g):
            break
        g = clone_structure(g)
        infer_graph(g)
    return g


def _is_if(n: Node) -> bool:
    return n.op_type == "If" and is_default_domain(n) and bool(n.inputs) and bool(n.outputs)


def inline_constant_ifs(graph: Graph, decided: Mapping[str, bool] | None = None) -> bool:
    """Replace (in place) each top-level `If` whose condition is a known constant, or which `decided` names (by its
    first output) with a truth value, by its taken branch's nodes; the branch's own names get a prefix, its outputs
    reach the `If`'s outputs through Identity. True if any changed."""
    consts = graph.constants() if decided is None else {}
    taken = set(graph.initializers) | {v.name for v in graph.inputs} | {o for n in graph.nodes for o in n.outputs}
    nodes: list[Node] = []
    changed = False
    for k, n in enumerate(graph.nodes):
        cond = None
        if _is_if(n):
            cond = consts.get(n.inputs[0]) if decided is None else decided.get(n.outputs[0])
        if cond is None or np.asarray(cond).size != 1:
            nodes.append(n)
            continue
        branch = n.attrs["then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch"]
        prefix = f"{n.name or f'if{k}'}__{'then' if bool(np.asarray(cond).reshape(-1)[0]) else 'else'}/"
        local = set(branch.initializers) | {o for m in branch.nodes for o in m.outputs if o}
        rename = {x: _fresh(prefix + x, taken) for x in local}
        for name, arr in branch.initializers.items():
            graph.initializers[rename[name]] = arr
        for m in branch.nodes:
            nodes.append(Node(m.op_type, m.domain, prefix + (m.name or m.op_type),
                              {a: _rename_in(v, rename) for a, v in m.attrs.items()},
                              [rename.get(x, x) if x else x for x in m.inputs],
                              [rename.get(x, x) if x else x for x in m.outputs]))
        for out, bv in zip(n.outputs, branch.outputs):
            if out:
                nodes.append(Node("Identity", "", f"{prefix}out/{out}", {}, [rename.get(bv.name, bv.name)], [out]))
        changed = True
    graph.nodes = nodes
    return changed


_COMPARE = {"Equal": lambda a, b: eq(a, b), "Greater": lambda a, b: a > b, "Less": lambda a, b: a < b,
            "GreaterOrEqual": lambda a, b: a >= b, "LessOrEqual": lambda a, b: a <= b}


def symbol_sources(graph: Graph) -> dict[str, tuple[str, int]]:
    """Input symbol -> the first (input, axis) whose declared dim is exactly that symbol."""
    out: dict[str, tuple[str, int]] = {}
    for v in graph.inputs:
        for axis, d in enumerate(v.shape or ()):
            if isinstance(d, Expr) and d.is_atom() and isinstance(d.atom(), Symbol):
                out.setdefault(d.atom().name, (v.name, axis))
    return out


def shape_branches(graph: Graph) -> list[tuple[str, Cond]]:
    """(first output, condition) of each top-level `If` whose condition inference knows as a comparison of the
    input symbols (`Equal(Shape(x)[d], 1)`), each symbol read from an input axis, and which no constant decides."""
    sources = symbol_sources(graph)
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    out = []
    for n in graph.nodes:
        if not _is_if(n):
            continue
        c = _condition(graph, producer, n.inputs[0], 8)
        if isinstance(c, Cond) and c.free_symbols <= sources.keys():
            out.append((n.outputs[0], c))
    return out


def _scalar(graph: Graph, name: str) -> object:
    t = graph.types.get(name)
    v = getattr(t, "value", None)
    if v is None or np.size(v) != 1:
        return None
    x = np.asarray(v).reshape(-1)[0]
    return x if isinstance(x, Expr) else int(x) if np.asarray(v).dtype.kind in "biuO" else None


def _condition(graph: Graph, producer: dict, name: str, depth: int) -> Cond | None:
    """The condition a boolean scalar computes, as a condition on the symbols, or None: comparisons of values
    inference knows (an Expr, or an int), through casts and reshapes of one element."""
    n = producer.get(name)
    if n is None or depth == 0 or not is_default_domain(n):
        return None
    if n.op_type in _COMPARE and len(n.inputs) == 2:
        a, b = _scalar(graph, n.inputs[0]), _scalar(graph, n.inputs[1])
        if a is None or b is None or not (isinstance(a, Expr) or isinstance(b, Expr)):
            return None
        c = _COMPARE[n.op_type](a, b)
        return c if isinstance(c, Cond) else None
    if n.op_type == "Not":
        c = _condition(graph, producer, n.inputs[0], depth - 1)
        return None if c is None else c.negate()
    if n.op_type in ("Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten") and n.inputs:
        t, src = graph.types.get(n.outputs[0]), graph.types.get(n.inputs[0])
        if n.op_type == "Cast" and not (np.dtype(getattr(t, "dtype", "f")) == np.bool_
                                        and np.dtype(getattr(src, "dtype", "f")) == np.bool_):
            return None  # a cast to bool of a number is "nonzero", not the comparison
        return _condition(graph, producer, n.inputs[0], depth - 1)
    return None


def _fresh(name: str, taken: set[str]) -> str:
    out, i = name, 0
    while out in taken:
        i += 1
        out = f"{name}_{i}"
    taken.add(out)
    return out


def _rename_in(attr: object, rename: dict[str, str]) -> object:
    """An attribute with the names a nested subgraph reads from the inlined branch renamed (its own names kept)."""
    if isinstance(attr, Graph):
        return _rename_free(attr, rename)
    if isinstance(attr, list) and any(isinstance(g, Graph) for g in attr):
        return [_rename_free(g, rename) if isinstance(g, Graph) else g for g in attr]
    return attr


def _rename_free(g: Graph, rename: dict[str, str]) -> Graph:
    from dynshape.ir.specialize import clone_structure

    local = {v.name for v in g.inputs} | set(g.initializers) | {o for m in g.nodes for o in m.outputs if o}
    outer = {k: v for k, v in rename.items() if k not in local}
    c = clone_structure(g)
    c.nodes = [Node(m.op_type, m.domain, m.name, {a: _rename_in(v, outer) for a, v in m.attrs.items()},
                    [outer.get(x, x) if x else x for x in m.inputs], list(m.outputs)) for m in c.nodes]
    c.outputs = [Value(outer.get(v.name, v.name), v.dtype, v.shape, v.kind) for v in c.outputs]
    return c
