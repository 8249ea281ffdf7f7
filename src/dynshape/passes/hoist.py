"""Scalar pointwise ops move above pure data movement (Reshape, Transpose, ...).

Attention exporters scale Q and Kᵀ *after* splitting heads: `Mul(Transpose(Reshape(q_proj)), c)`. Between the
product and the Mul sit copies, so the Mul runs as a kernel of its own (0.65 ms a layer at batch 8 x 512).
Moved above the movement it joins the product's epilogue, and the movement left behind is what the head
folding and the attention kernel already absorb.

Exact: an elementwise op whose other operands are scalars computes the same value for each element wherever
that element sits, so moving data before or after it gives bitwise the same tensor.
"""

from __future__ import annotations

import dataclasses

from dynshape.ir import opdef
from dynshape.ir.graph import Node
from dynshape.ir.types import TensorType
from dynshape.passes.values import is_movement


def _scalar_operand_op(n: Node, types: dict, consts: dict) -> int | None:
    """Index of the one tensor operand of a binary op whose other operand is a scalar constant, else None."""
    op = opdef.of(n)
    if op is None or not op.arithmetic or len(n.inputs) != 2 or len(n.outputs) != 1:
        return None
    out = types.get(n.outputs[0])
    for i in (0, 1):
        c = consts.get(n.inputs[1 - i])
        t = types.get(n.inputs[i])
        if c is None or n.inputs[i] in consts or not isinstance(t, TensorType) or not isinstance(out, TensorType):
            continue
        if c.size == 1 and c.dtype == t.dtype == out.dtype and tuple(out.shape) == tuple(t.shape):
            return i
    return None


def hoist_scalar_ops(nodes: list[Node], types: dict, consts: dict, keep: set[str]) -> tuple[list[Node], dict]:
    """`nodes` (in order) with each scalar op that reads a chain of single-reader movement nodes moved above
    the chain. Returns the nodes and {new value name: the value whose type it has}."""
    new_types: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        producer = {o: n for n in nodes for o in n.outputs if o}
        readers: dict[str, int] = {}
        for n in nodes:
            for x in n.inputs:
                readers[x] = readers.get(x, 0) + 1
        for n in nodes:
            i = _scalar_operand_op(n, types, consts)
            if i is None:
                continue
            chain: list[Node] = []  # movement nodes, last first
            x = n.inputs[i]
            while (m := producer.get(x)) is not None and is_movement(m) \
                    and len([o for o in m.outputs if o]) == 1 and readers.get(x) == 1 and x not in keep:
                chain.append(m)
                x = m.inputs[0]
            c = consts[n.inputs[1 - i]]
            src = types.get(x)
            if not chain or not isinstance(src, TensorType) or c.ndim > len(src.shape) or x in consts:
                continue
            first, last = chain[-1], chain[0]
            moved = f"{n.outputs[0]}__hoisted"
            while moved in types or moved in new_types:
                moved += "_"
            ins = list(n.inputs)
            ins[i] = x
            scaled = dataclasses.replace(n, inputs=ins, outputs=[moved])
            swap = {id(first): dataclasses.replace(first, inputs=[moved, *first.inputs[1:]])}
            tail = swap.get(id(last), last)
            swap[id(last)] = dataclasses.replace(tail, outputs=[n.outputs[0]])
            out: list[Node] = []
            for m in nodes:
                if m is n:
                    continue
                if m is first:
                    out.append(scaled)
                out.append(swap.get(id(m), m))
            new_types[moved] = new_types.get(x, x)
            nodes, changed = out, True
            break
    return nodes, new_types


def with_types(graph, new_types: dict):
    """The graph with the hoisted values typed (each as the value it was computed from)."""
    if not new_types:
        return graph
    types = dict(graph.types)
    for name, like in new_types.items():
        types[name] = types[like]
    return dataclasses.replace(graph, types=types)

