"""What every loop-nest lowering needs first: its operands, their broadcast patterns and the loop levels.

An operand is either a one-element constant (inlined as a literal: the C compiler folds it into the
arithmetic) or a pointer with a broadcast pattern over the iteration shape (per axis: spans it, or is
broadcast along it). Adjacent axes on which every operand has the same pattern are coalesced into one loop
level, so a residual add over (batch, seq, 256) is one flat loop and a bias add is (batch*seq) x 256 with 256
a literal the compiler unrolls and vectorises.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynshape.codegen import kir
from dynshape.codegen.lowering import Unsupported
from dynshape.ir.graph import Graph
from dynshape.passes.values import broadcast_pattern, const_value, scalar_const
from dynshape.sym import Expr


def dtype_of(graph: Graph, name: str) -> str:
    return np.dtype(graph.types[name].dtype).name


@dataclass
class Operands:
    scalars: dict[str, kir.Expr]  # value -> its inlined literal
    ptrs: list[str]  # values read through a pointer, in parameter order
    patterns: list[tuple]  # per pointer: its broadcast pattern over the iteration shape
    buffers: list[kir.Buffer]  # per pointer: its parameter


def operands(inputs: tuple[str, ...] | list[str], shape: tuple, graph: Graph, first_param: int = 0) -> Operands:
    """Classify `inputs` over the iteration `shape`; Unsupported when one does not broadcast to it."""
    ops = Operands({}, [], [], [])
    for x in inputs:
        c = scalar_const(x, graph)
        if c is not None:
            ops.scalars[x] = literal(const_value(x, graph))
            continue
        pat = broadcast_pattern(tuple(graph.types[x].shape), shape) if shape else (True,)
        if pat is None:
            raise Unsupported(f"operand {x!r} of shape {tuple(graph.types[x].shape)} does not broadcast to {shape}")
        ops.ptrs.append(x)
        ops.patterns.append(pat)
        ops.buffers.append(kir.Buffer(f"i{first_param + len(ops.ptrs) - 1}", dtype_of(graph, x)))
    return ops


def literal(c: np.ndarray) -> kir.Const:
    """A one-element constant as a literal of its own kind: an integer stays an exact int64 literal (as a float
    literal, `ids == 1.0f` would compare int64 ids converted to float, wrong above 2**24), a bool a 0/1."""
    v = np.asarray(c).reshape(-1)[0]
    if c.dtype == np.bool_:
        return kir.Const(bool(v), kir.BOOL)
    if c.dtype.kind in "iu":
        return kir.Const(int(v), kir.I64)
    return kir.Const(float(v), kir.F32)


def levels(patterns: list[tuple], axes: range) -> list[list[int]]:
    """Group adjacent axes on which every operand has the same broadcast pattern."""
    out: list[list[int]] = []
    for k in axes:
        col = tuple(p[k] for p in patterns)
        if out and tuple(p[out[-1][-1]] for p in patterns) == col:
            out[-1].append(k)
        else:
            out.append([k])
    return out


def prod(shape: tuple, axes: list[int]):
    """The product of shape[axes] as a dim (int or symbolic)."""
    d = 1
    for k in axes:
        d = d * shape[k]
    return d


def computable(shape: tuple, key_names: set[str]) -> None:
    """Every dim of `shape` follows from the call's symbols (else the loop bounds are unknown per call)."""
    for d in shape:
        if isinstance(d, Expr) and not d.free_symbols <= key_names:
            raise Unsupported(f"dim {d} depends on tensor data (symbols {sorted(d.free_symbols - key_names)}), "
                              "not only on the call's shape")


def strides(spans: list[list[bool]], extents: list[kir.Expr]) -> tuple[list[kir.Stmt], list[list[kir.Var]]]:
    """Per operand j and loop level i, its stride: the product of the inner levels it spans (0 where it is
    broadcast). Returns the Let statements and the stride variables."""
    stmts: list[kir.Stmt] = []
    table: list[list[kir.Var]] = []
    n = len(extents)
    for j, span in enumerate(spans):
        row = []
        for i in range(n):
            v = kir.Var(f"S{j}_{i}")
            value = kir.product(extents[m] for m in range(i + 1, n) if span[m]) if span[i] else kir.Const(0, kir.I64)
            stmts.append(kir.Let(v, value))
            row.append(v)
        table.append(row)
    return stmts, table


def flat_index(idx: list[kir.Expr], extents: list[kir.Expr]) -> kir.Expr:
    """Row-major position of (idx...) in a dense array of `extents`."""
    n = len(idx)
    return kir.total(kir.product([idx[i], *extents[i + 1:n]]) for i in range(n))


def strided_index(idx: list[kir.Expr], stride: list[kir.Var]) -> kir.Expr:
    return kir.total(kir.Bin("*", a, s) for a, s in zip(idx, stride))
