"""Control flow decided by an input's value: the graph specialised to that value, its `If`s inlined.

Real exports branch on small inputs: a voice-activity model picks its front end by the sample rate it is fed
(`If(Equal(sr, 16000))`, three of them, the LSTM state going in and out). Run as written, every branch runs on
the interpreter, op by op, every call (25x slower than the same network without `If`). But such a condition
depends only on an input that takes a handful of values: specialised to one value, each condition is a constant,
each `If` is just its taken branch, and the whole graph compiles as one. `branch_inputs` finds those inputs;
`specialize_values` makes the copy for one value (the compiler builds one per value seen, `runtime.branch_variants`).

Only small inputs qualify (static shape, at most `MAX_ELEMENTS` integer or bool elements): a value that
changes every call (a float signal, a token) would make a build per call.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dynshape.ir.graph import Graph, Node, Value

__all__ = ["MAX_ELEMENTS", "branch_inputs", "inline_constant_ifs", "specialize_values"]

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
        if n.op_type != "If" or n.domain not in ("", "ai.onnx") or not n.inputs:
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


def specialize_values(graph: Graph, values: Mapping[str, np.ndarray]) -> Graph:
    """A copy of `graph` (initializers shared) where the named inputs are constants with these values, every `If`
    whose condition is then known replaced by its taken branch (repeatedly: a branch may hold another), re-inferred.
    The named inputs are no longer inputs of the copy."""
    from dynshape.ir.infer import infer_graph
    from dynshape.ir.specialize import clone_structure

    g = clone_structure(graph)
    g.inputs = [v for v in graph.inputs if v.name not in values]
    g.initializers.update({k: np.asarray(v) for k, v in values.items()})
    infer_graph(g)
    for _ in range(16):  # nesting depth; each round inlines every If whose condition inference now knows
        if not inline_constant_ifs(g):
            break
        g = clone_structure(g)
        infer_graph(g)
    return g


def inline_constant_ifs(graph: Graph) -> bool:
    """Replace (in place) each top-level `If` whose condition is a known constant by its taken branch's nodes; the
    branch's own names get a prefix, its outputs reach the `If`'s outputs through Identity. True if any changed."""
    consts = graph.constants()
    taken = set(graph.initializers) | {v.name for v in graph.inputs} | {o for n in graph.nodes for o in n.outputs}
    nodes: list[Node] = []
    changed = False
    for k, n in enumerate(graph.nodes):
        cond = consts.get(n.inputs[0]) if n.op_type == "If" and n.domain in ("", "ai.onnx") and n.inputs else None
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
