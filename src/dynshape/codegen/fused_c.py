"""C for fused elementwise groups: one loop nest per group, dynamic dims as runtime int64, static ones literal.

Axes are coalesced where every operand has the same broadcast pattern, so a residual add over
(batch, seq, 256) is one flat loop and a bias add is (batch*seq) x 256 with 256 a literal the compiler
unrolls and vectorises. Per call only the loop extents are computed (from the symbol values); strides
follow from them in C.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from dynshape.codegen.cgen import c_float
from dynshape.ir.graph import Graph
from dynshape.passes.fusion import Group, _scalar_const, broadcast_pattern
from dynshape.runtime.binder import to_py
from dynshape.sym import Expr


@dataclass
class GroupKernel:
    name: str
    source: str
    loop_dims: list  # int | Expr per loop level
    out_shape: tuple
    inputs: list  # external value names passed as pointers (scalar constants are inlined)
    outputs: list


def _unary(op: str, a: str) -> str:
    return {
        "Neg": f"(-{a})", "Abs": f"fabsf({a})", "Sqrt": f"sqrtf({a})", "Reciprocal": f"(1.0f / {a})",
        "Exp": f"ds_expf({a})", "Erf": f"ds_erff({a})", "Tanh": f"ds_tanhf({a})",
        "Sigmoid": f"(1.0f / (1.0f + ds_expf(-{a})))", "Relu": f"({a} < 0.0f ? 0.0f : {a})", "Identity": a,
    }[op]


def _pow(a: str, p: float) -> str:
    if p == 1.0:
        return a
    if p == 2.0:
        return f"({a} * {a})"
    if p == 3.0:
        return f"({a} * {a} * {a})"
    if p == 0.5:
        return f"sqrtf({a})"
    return f"powf({a}, {c_float(p)})"


def emit_group(g: Group, graph: Graph, name: str, key_names: set) -> GroupKernel | None:
    """C source for one group, or None when a dim is not computable from the call's symbols."""
    out_shape = tuple(g.shape) or (1,)
    for d in out_shape:
        if isinstance(d, Expr) and not d.free_symbols <= key_names:
            return None
    rank = len(out_shape)
    scalars: dict[str, str] = {}
    ptr_inputs: list[str] = []
    patterns: list[tuple] = []
    for x in g.inputs:
        c = _scalar_const(x, graph)
        if c is not None:
            scalars[x] = c_float(c)
            continue
        pat = broadcast_pattern(tuple(graph.types[x].shape), tuple(g.shape)) if g.shape else (True,)
        if pat is None:
            return None
        ptr_inputs.append(x)
        patterns.append(pat)
    # coalesce adjacent axes with identical patterns across all operands
    cols = [tuple(p[k] for p in patterns) for k in range(rank)]
    levels: list[list[int]] = []
    for k in range(rank):
        if levels and cols[levels[-1][-1]] == cols[k]:
            levels[-1].append(k)
        else:
            levels.append([k])
    loop_dims = []
    for lv in levels:
        d = 1
        for k in lv:
            d = d * out_shape[k]
        loop_dims.append(d)
    spans = [[cols[lv[0]][j] for lv in levels] for j in range(len(ptr_inputs))]
    n = len(loop_dims)
    dyn = [i for i, d in enumerate(loop_dims) if not isinstance(d, int)]
    lines = [f"void {name}(const int64_t *d"]
    lines[0] += "".join(f", float *restrict o{k}" for k in range(len(g.outputs)))
    for j, x in enumerate(ptr_inputs):
        ctype = "uint8_t" if np.dtype(graph.types[x].dtype) == np.bool_ else "float"
        lines[0] += f", const {ctype} *restrict i{j}"
    lines[0] += ") {"
    for i, d in enumerate(loop_dims):
        lines.append(f"    const int64_t L{i} = {('d[' + str(dyn.index(i)) + ']') if i in dyn else d};")
    for j in range(len(ptr_inputs)):  # stride of input j at level i: product of the inner levels it spans
        for i in range(n):
            if not spans[j][i]:
                lines.append(f"    const int64_t S{j}_{i} = 0;")
            else:
                inner = [f"L{m}" for m in range(i + 1, n) if spans[j][m]]
                lines.append(f"    const int64_t S{j}_{i} = {' * '.join(inner) or '1'};")
    indent = "    "
    for i in range(n):
        lines.append(f"{indent}for (int64_t a{i} = 0; a{i} < L{i}; a{i}++) {{")
        indent += "    "
    flat = " + ".join(f"a{i}" + "".join(f" * L{m}" for m in range(i + 1, n)) for i in range(n))
    lines.append(f"{indent}const int64_t o = {flat};")
    env: dict[str, str] = dict(scalars)
    for j, x in enumerate(ptr_inputs):
        idx = " + ".join(f"a{i} * S{j}_{i}" for i in range(n))
        env[x] = f"v{j}"
        ctype = "uint8_t" if np.dtype(graph.types[x].dtype) == np.bool_ else "float"
        lines.append(f"{indent}const {ctype} v{j} = i{j}[{idx}];")
    for k, node in enumerate(g.nodes):
        args = [env[x] for x in node.inputs]
        op = node.op_type
        if op in ("Add", "Sub", "Mul", "Div"):
            expr = f"({args[0]} {'+-*/'['Add Sub Mul Div'.split().index(op)]} {args[1]})"
        elif op == "Pow":
            expr = _pow(args[0], float(_scalar_const(node.inputs[1], graph)))
        elif op == "Where":
            expr = f"({args[0]} ? {args[1]} : {args[2]})"
        else:
            expr = _unary(op, args[0])
        lines.append(f"{indent}const float t{k} = {expr};")
        env[node.outputs[0]] = f"t{k}"
    for k, o in enumerate(g.outputs):
        lines.append(f"{indent}o{k}[o] = {env[o]};")
    for _ in range(n):
        indent = indent[:-4]
        lines.append(f"{indent}}}")
    lines.append("}")
    return GroupKernel(name, "\n".join(lines) + "\n", loop_dims, tuple(g.shape), ptr_inputs, list(g.outputs))


def make_step(k: GroupKernel, lib: ctypes.CDLL, symbols: list):
    """The Python side of a group: `fn(args, key) -> outputs` (args in k.inputs order)."""
    fn = getattr(lib, k.name)
    fn.restype = None
    names = {s.name: f"s{i}" for i, s in enumerate(symbols)}
    dyn = [d for d in k.loop_dims if not isinstance(d, int)]
    unpack = "".join(f"{n}, " for n in names.values())
    src = "def dims(key):\n"
    if symbols:
        src += f"    ({unpack}) = key\n"
    dyn_src = "".join(to_py(d, names) + ", " for d in dyn)
    shape_src = "".join(to_py(d, names) + ", " for d in k.out_shape)
    src += f"    return ({dyn_src}), ({shape_src})\n"
    scope: dict = {}
    exec(src, scope)  # noqa: S102 - our own generated source
    dims = scope["dims"]
    n_out = len(k.outputs)
    f32 = np.float32

    def step(args, key):
        dyn_vals, shape = dims(key)
        d = np.array(dyn_vals, dtype=np.int64)
        outs = [np.empty(shape, f32) for _ in range(n_out)]
        ins = [np.ascontiguousarray(a) for a in args]
        fn(d.ctypes.data, *[o.ctypes.data for o in outs], *[a.ctypes.data for a in ins])
        return outs

    fn.argtypes = [ctypes.c_void_p] * (1 + n_out + len(k.inputs))
    return step
