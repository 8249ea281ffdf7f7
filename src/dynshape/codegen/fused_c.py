"""C for fused groups: one loop nest per group, dynamic dims as runtime int64, static ones literal.

Elementwise groups: axes are coalesced where every operand has the same broadcast pattern, so a residual
add over (batch, seq, 256) is one flat loop and a bias add is (batch*seq) x 256 with 256 a literal the
compiler unrolls and vectorises. Softmax groups: the last axis is the row; the producer group's expression
is evaluated into a row buffer, the softmax reduces it in cache, and the consumer group's expression is
applied on the way out (masking + softmax + NaN clean-up in one pass over memory).
Per call only the loop extents are computed (from the symbol values); strides follow from them in C.
Division by a constant is emitted as a product with its float32 reciprocal (at most 1 ulp apart, as XLA and
onnxruntime do): a vector division costs as much as ten fused multiply-adds.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import numpy as np

from dynshape.codegen.cgen import c_float
from dynshape.codegen.packed_gemm import NR, PAR_MIN_FLOPS, ROW_BLOCK, ROW_TAIL
from dynshape.ir.graph import Graph, Node
from dynshape.passes.fusion import (
    AttentionGroup,
    GemmGroup,
    Group,
    SoftmaxGroup,
    _row_pattern,
    _scalar_const,
    broadcast_pattern,
)
from dynshape.runtime.binder import to_py
from dynshape.sym import Expr

PAR_MIN_ELEMENTS = 1 << 15  # below this a loop nest runs on one thread: waking a team costs more than it saves


@dataclass
class GroupKernel:
    name: str
    source: str
    loop_dims: list  # int | Expr per loop level
    out_shape: tuple
    inputs: list  # external value names passed as pointers (scalar constants are inlined)
    outputs: list
    out_dtypes: list


def _ctype(graph: Graph, name: str) -> str:
    return "uint8_t" if np.dtype(graph.types[name].dtype) == np.bool_ else "float"


def _unary(op: str, a: str) -> str:
    return {
        "Neg": f"(-{a})", "Abs": f"fabsf({a})", "Sqrt": f"sqrtf({a})", "Reciprocal": f"(1.0f / {a})",
        "Exp": f"ds_expf({a})", "Erf": f"ds_erff({a})", "Tanh": f"ds_tanhf({a})",
        "Sigmoid": f"(1.0f / (1.0f + ds_expf(-{a})))", "Relu": f"({a} < 0.0f ? 0.0f : {a})", "Identity": a,
        "IsNaN": f"(uint8_t)({a} != {a})",
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


def _emit_nodes(nodes: list, env: dict, graph: Graph, lines: list, indent: str, tag: str) -> None:
    """`const T tK = expr;` per node, in order; env maps value names to C expressions (updated)."""
    for k, node in enumerate(nodes):
        args = [env[x] for x in node.inputs]
        op = node.op_type
        if op == "Div" and (c := _scalar_const(node.inputs[1], graph)) not in (None, 0.0) and math.isfinite(c):
            expr = f"({args[0]} * {c_float(1.0 / np.float32(c))})"  # a vdivps costs ~10 FMAs; <= 1 ulp apart
        elif op in ("Add", "Sub", "Mul", "Div"):
            expr = f"({args[0]} {'+-*/'['Add Sub Mul Div'.split().index(op)]} {args[1]})"
        elif op == "Pow":
            expr = _pow(args[0], float(_scalar_const(node.inputs[1], graph)))
        elif op == "Where":
            expr = f"({args[0]} ? {args[1]} : {args[2]})"
        else:
            expr = _unary(op, args[0])
        var = f"t{tag}{k}"
        lines.append(f"{indent}const {_ctype(graph, node.outputs[0])} {var} = {expr};")
        env[node.outputs[0]] = var


@dataclass
class _Operands:
    scalars: dict
    ptrs: list
    patterns: list


def _operands(inputs: list, shape: tuple, graph: Graph) -> _Operands | None:
    scalars: dict[str, str] = {}
    ptrs, patterns = [], []
    for x in inputs:
        c = _scalar_const(x, graph)
        if c is not None:
            scalars[x] = c_float(c)
            continue
        pat = broadcast_pattern(tuple(graph.types[x].shape), shape) if shape else (True,)
        if pat is None:
            return None
        ptrs.append(x)
        patterns.append(pat)
    return _Operands(scalars, ptrs, patterns)


def _levels(patterns: list, axes: range) -> list[list[int]]:
    """Group adjacent axes on which every operand has the same broadcast pattern."""
    levels: list[list[int]] = []
    for k in axes:
        col = tuple(p[k] for p in patterns)
        if levels and tuple(p[levels[-1][-1]] for p in patterns) == col:
            levels[-1].append(k)
        else:
            levels.append([k])
    return levels


def _prod(shape: tuple, axes: list[int]):
    d = 1
    for k in axes:
        d = d * shape[k]
    return d


def _signature(name: str, outputs: list, ops: _Operands, graph: Graph) -> str:
    head = f"void {name}(const int64_t *d"
    head += "".join(f", {_ctype(graph, o)} *restrict o{k}" for k, o in enumerate(outputs))
    head += "".join(f", const {_ctype(graph, x)} *restrict i{j}" for j, x in enumerate(ops.ptrs))
    return head + ") {"


def _dims_prologue(loop_dims: list, lines: list) -> None:
    dyn = [i for i, d in enumerate(loop_dims) if not isinstance(d, int)]
    for i, d in enumerate(loop_dims):
        lines.append(f"    const int64_t L{i} = {('d[' + str(dyn.index(i)) + ']') if i in dyn else d};")


def _strides(spans: list, n: int, lines: list) -> None:
    for j, span in enumerate(spans):  # stride of input j at level i: product of the inner levels it spans
        for i in range(n):
            inner = [f"L{m}" for m in range(i + 1, n) if span[m]]
            lines.append(f"    const int64_t S{j}_{i} = {(' * '.join(inner) or '1') if span[i] else '0'};")


def _computable(shape: tuple, key_names: set) -> bool:
    return all(not isinstance(d, Expr) or d.free_symbols <= key_names for d in shape)


def emit_group(g: Group, graph: Graph, name: str, key_names: set) -> GroupKernel | None:
    """C source for one elementwise group, or None when a dim is not computable from the call's symbols."""
    out_shape = tuple(g.shape) or (1,)
    if not _computable(out_shape, key_names):
        return None
    ops = _operands(g.inputs, tuple(g.shape), graph)
    if ops is None:
        return None
    levels = _levels(ops.patterns, range(len(out_shape)))
    loop_dims = [_prod(out_shape, lv) for lv in levels]
    spans = [[p[lv[0]] for lv in levels] for p in ops.patterns]
    n = len(loop_dims)
    lines = [_signature(name, g.outputs, ops, graph)]
    _dims_prologue(loop_dims, lines)
    _strides(spans, n, lines)
    indent = "    "
    work = " * ".join(f"L{i}" for i in range(n))
    lines.append(f"    #pragma omp parallel for {f'collapse({n - 1})' if n > 1 else 'simd'} schedule(static) "
                 f"if({work} >= {PAR_MIN_ELEMENTS})")
    for i in range(n):
        lines.append(f"{indent}for (int64_t a{i} = 0; a{i} < L{i}; a{i}++) {{")
        indent += "    "
    flat = " + ".join(f"a{i}" + "".join(f" * L{m}" for m in range(i + 1, n)) for i in range(n))
    lines.append(f"{indent}const int64_t o = {flat};")
    env: dict[str, str] = dict(ops.scalars)
    for j, x in enumerate(ops.ptrs):
        idx = " + ".join(f"a{i} * S{j}_{i}" for i in range(n))
        env[x] = f"v{j}"
        lines.append(f"{indent}const {_ctype(graph, x)} v{j} = i{j}[{idx}];")
    _emit_nodes(g.nodes, env, graph, lines, indent, "")
    for k, o in enumerate(g.outputs):
        lines.append(f"{indent}o{k}[o] = {env[o]};")
    for _ in range(n):
        indent = indent[:-4]
        lines.append(f"{indent}}}")
    lines.append("}")
    return GroupKernel(name, "\n".join(lines) + "\n", loop_dims, tuple(g.shape), ops.ptrs, list(g.outputs),
                       [np.dtype(graph.types[o].dtype) for o in g.outputs])


def _softmax_passes(sg: SoftmaxGroup, graph: Graph, lines: list, ind: str, v: str, extent: str, load,
                    first: dict, store, defer: str | None = None) -> None:
    """The three passes over one row buffer `row` (index `v` < `extent`): producer group and maximum; exp and
    sum; normalisation and consumer group. `load(nodes, extra)` emits the operand loads a pass needs and
    returns their C names; `first` seeds the first pass's names; `store(env)` gives the last pass's stores.
    `defer`: a C lvalue that receives the row's scale instead of the third pass (see _deferrable)."""
    inner = ind + "    "
    loop = f"{ind}for (int64_t {v} = 0; {v} < {extent}; {v}++) {{"
    x, y = sg.node.inputs[0], sg.node.outputs[0]
    lines += [f"{ind}float mx = -INFINITY;", f"{ind}#pragma omp simd reduction(max:mx)", loop]
    env = {**load(sg.pre.nodes if sg.pre else [], () if sg.pre or x in first else (x,)), **first}
    if sg.pre:
        _emit_nodes(sg.pre.nodes, env, graph, lines, inner, "p")
    lines += [f"{inner}row[{v}] = {env[x]};", f"{inner}mx = {env[x]} > mx ? {env[x]} : mx;", f"{ind}}}"]
    lines += [f"{ind}float s = 0.0f;", f"{ind}#pragma omp simd reduction(+:s)", loop,
              f"{inner}const float e = ds_expf_nonpos(row[{v}] - mx);", f"{inner}row[{v}] = e;", f"{inner}s += e;",
              f"{ind}}}", f"{ind}const float inv = 1.0f / s;"]
    if defer is not None:  # the caller scales the product of this row instead (one pass less)
        if sg.post is not None:  # the NaN clean-up: a row with a NaN is all NaN, hence all zeros after it
            lines += [f"{ind}if (s != s) {{", f"{ind}    for (int64_t {v} = 0; {v} < {extent}; {v}++) row[{v}] = 0.0f;",
                      f"{ind}    {defer} = 1.0f;", f"{ind}}} else {{", f"{ind}    {defer} = inv;", f"{ind}}}"]
        else:
            lines.append(f"{ind}{defer} = inv;")
        return
    lines.append(loop)
    env = load(sg.post.nodes if sg.post else [], ())
    lines.append(f"{inner}const float sm = row[{v}] * inv;")
    env[y] = "sm"
    if sg.post:
        _emit_nodes(sg.post.nodes, env, graph, lines, inner, "q")
    lines += [inner + ln for ln in store(env)] + [f"{ind}}}"]


def _deferrable(sg: SoftmaxGroup, graph: Graph) -> bool:
    """The softmax's consumer is nothing, or only the exporters' NaN clean-up Where(IsNaN(p), 0, p): then
    P @ V = (E @ V) * (1 / sum E) row by row, and the normalising pass can ride on the product."""
    if sg.post is None:
        return True
    nodes, y = sg.post.nodes, sg.node.outputs[0]
    if len(nodes) != 2 or [n.op_type for n in nodes] != ["IsNaN", "Where"] or sg.outputs != [nodes[1].outputs[0]]:
        return False
    isnan, where = nodes
    return isnan.inputs == [y] and where.inputs[0] == isnan.outputs[0] and where.inputs[2] == y \
        and _scalar_const(where.inputs[1], graph) == 0.0


def emit_softmax(sg: SoftmaxGroup, graph: Graph, name: str, key_names: set) -> GroupKernel | None:
    """C source for producer group -> last-axis softmax -> consumer group, one row at a time."""
    shape = tuple(sg.shape)
    if not _computable(shape, key_names):
        return None
    ops = _operands(sg.inputs, shape, graph)
    if ops is None:
        return None
    rank = len(shape)
    levels = _levels(ops.patterns, range(rank - 1)) + [[rank - 1]]
    loop_dims = [_prod(shape, lv) for lv in levels]
    spans = [[p[lv[0]] for lv in levels] for p in ops.patterns]
    n = len(loop_dims)  # level n-1 is the row
    lines = [_signature(name, sg.outputs, ops, graph)]
    _dims_prologue(loop_dims, lines)
    _strides(spans, n, lines)
    work = " * ".join(f"L{i}" for i in range(n))
    lines += [f"    #pragma omp parallel if({work} >= {PAR_MIN_ELEMENTS})", "    {",
              f"    float *row = (float *)malloc(sizeof(float) * (L{n - 1} > 0 ? L{n - 1} : 1));"]
    if n > 1:
        lines.append(f"    #pragma omp for collapse({n - 1}) schedule(static)")
    indent = "    "
    for i in range(n - 1):
        lines.append(f"{indent}for (int64_t a{i} = 0; a{i} < L{i}; a{i}++) {{")
        indent += "    "
    flat = " + ".join(f"a{i}" + "".join(f" * L{m}" for m in range(i + 1, n - 1)) for i in range(n - 1)) or "0"
    lines.append(f"{indent}const int64_t ob = ({flat}) * L{n - 1};")
    base = {j: " + ".join([f"a{i} * S{j}_{i}" for i in range(n - 1)] or ["0"]) for j in range(len(ops.ptrs))}
    inner = indent + "    "

    def load(nodes: list, extra: tuple) -> dict:
        env = dict(ops.scalars)
        used = {x for nd in nodes for x in nd.inputs} | set(extra)
        for j, x in enumerate(ops.ptrs):
            if x in used:
                lines.append(f"{inner}const {_ctype(graph, x)} v{j} = i{j}[{base[j]} + r * S{j}_{n - 1}];")
                env[x] = f"v{j}"
        return env

    _softmax_passes(sg, graph, lines, indent, "r", f"L{n - 1}", load, {},
                    lambda env: [f"o{k}[ob + r] = {env[o]};" for k, o in enumerate(sg.outputs)])
    for _ in range(n - 1):
        indent = indent[:-4]
        lines.append(f"{indent}}}")
    lines += ["    free(row);", "    }", "}"]
    return GroupKernel(name, "\n".join(lines) + "\n", loop_dims, shape, ops.ptrs, list(sg.outputs),
                       [np.dtype(graph.types[o].dtype) for o in sg.outputs])


def packed_name(gg: GemmGroup) -> str:
    """The constant that holds gg's weight packed by codegen.packed_gemm.pack_b."""
    return f"{gg.weight}::packed{'T' if gg.trans_b else ''}"


def row_blocks(m: str) -> str:
    """C for the number of row blocks of m rows: blocks of ROW_BLOCK, the last one also takes a short tail
    (64 rows are one block of 64, not 60 + 4: the weights are not streamed again for 4 rows)."""
    return (f"({m} > {ROW_BLOCK} && {m} % {ROW_BLOCK} <= {ROW_TAIL} ? {m} / {ROW_BLOCK} "
            f": ({m} + {ROW_BLOCK - 1}) / {ROW_BLOCK})")


def emit_gemm(gg: GemmGroup, graph: Graph, name: str, key_names: set) -> GroupKernel | None:
    """C for a product by a packed constant matrix, its epilogue applied to each block of rows in cache.

    Signature: (d, out, A, packed B, epilogue operands...); loop_dims = [rows] with rows = prod(shape[:-1]).
    """
    node, shape = gg.node, tuple(gg.shape)
    if not _computable(shape, key_names):
        return None
    a_name = node.inputs[0]
    k = graph.types[a_name].shape[-1]
    n = shape[-1] if shape else 1
    if not isinstance(k, int) or not isinstance(n, int) or k <= 0 or n <= 0:
        return None
    rows = _prod(shape, list(range(len(shape) - 1)))
    ln = gg.layernorm
    ln_params = [x for x in ln.inputs[1:3] if x] if ln is not None else []
    extra = gg.inputs[1:len(gg.inputs) - len(ln_params)]
    ops = _operands(extra, shape, graph)
    if ops is None or not all(_row_pattern(p) for p in ops.patterns):
        return None
    if any(np.dtype(graph.types[x].dtype) != np.float32 for x in gg.outputs):
        return None
    if gg.folded and not (len(shape) == 3 and gg.heads and n % gg.heads == 0):
        return None
    if ln is not None and gg.folded:
        return None
    lines = [f"void {name}(const int64_t *d, float *restrict o0, const float *restrict i0, const float *restrict i1"
             + "".join(f", const {_ctype(graph, x)} *restrict i{j + 2}" for j, x in enumerate(ops.ptrs))
             + "".join(f", const float *restrict i{j + 2 + len(ops.ptrs)}" for j in range(len(ln_params))) + ") {"]
    heads = gg.heads if gg.folded else 0
    if heads:  # (b, s, heads * hd) written as (b, heads, s, hd): rows of one b at a time, row stride hd
        hd = n // heads
        _dims_prologue([rows, shape[1]], lines)
        at = f"dst[(r - rs) * {hd} + j - q * {NR}]"
    else:
        _dims_prologue([rows], lines)
        at = f"o0[r * {n} + j]"
    y = node.outputs[0]
    env: dict[str, str] = dict(ops.scalars)
    body = [f"const float acc = {at};"]
    for j, x in enumerate(ops.ptrs):
        pat = ops.patterns[j]
        idx = f"r * {n} + j" if all(pat) and len(pat) > 1 else ("j" if pat[-1] else "0")
        body.append(f"const {_ctype(graph, x)} v{j} = i{j + 2}[{idx}];")
        env[x] = f"v{j}"
    value = "acc"
    if node.op_type == "Gemm":
        alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
        if alpha != 1.0:
            value = f"({c_float(alpha)} * acc)"
        if len(node.inputs) > 2 and node.inputs[2] and beta != 0.0:
            c = env[node.inputs[2]]
            value = f"({value} + {c})" if beta == 1.0 else f"({value} + {c_float(beta)} * {c})"
    env[y] = value
    if gg.epilogue:
        _emit_nodes(gg.epilogue.nodes, env, graph, body, "", "")
    # the value before the folded reshapes or the LayerNormalization
    out = env[gg.folded[0].inputs[0] if gg.folded else ln.inputs[0] if ln is not None else gg.outputs[0]]
    epilogue = [] if out == "acc" else [
        f"const int64_t j1 = q * {NR} + {NR} < {n} ? q * {NR} + {NR} : {n};",
        "#pragma omp simd", f"for (int64_t j = q * {NR}; j < j1; j++) {{", *["    " + b for b in body],
        f"    {at} = {out};", "}"]
    blocks, panels = "NBLK", (n + NR - 1) // NR
    lines.append(f"    const int64_t NBLK = {row_blocks('L0')};")
    rows_of = [f"const int64_t r0 = rb * {ROW_BLOCK};", f"const int64_t r1 = rb == NBLK - 1 ? L0 : r0 + {ROW_BLOCK};"]
    if heads:  # rows of one b at a time, straight into their place in (b, heads, s, hd)
        tile = [f"const int64_t h = q * {NR} / {hd}, d0 = q * {NR} % {hd};",
                f"const int64_t nc = {n} - q * {NR} < {NR} ? {n} - q * {NR} : {NR};",
                "for (int64_t rs = r0; rs < r1;) {",
                "    const int64_t b = rs / L1, s = rs % L1, re = (b + 1) * L1 < r1 ? (b + 1) * L1 : r1;",
                f"    float *dst = o0 + ((b * {heads} + h) * L1 + s) * {hd} + d0;",
                f"    ds_gemm_panel(i0 + rs * {k}, {k}, i1 + q * {k * NR}, {NR}, dst, {hd}, 0, re - rs, nc, {k});",
                "    for (int64_t r = rs; r < re; r++) {", *["        " + e for e in epilogue], "    }",
                "    rs = re;", "}"]
    else:
        tile = [f"ds_gemm_tile(i0, {k}, i1, o0, {n}, r0, r1, q, {n}, {k});"]
        if epilogue:
            tile += ["for (int64_t r = r0; r < r1; r++) {", *["    " + e for e in epilogue], "}"]
    par = f"if(L0 * {n * k} >= {PAR_MIN_FLOPS})"
    tiles = [f"for (int64_t rb = 0; rb < {blocks}; rb++) {{", f"    for (int64_t q = 0; q < {panels}; q++) {{",
             *["        " + t for t in rows_of + tile], "    }", "}"]
    if ln is None:
        lines += [f"    #pragma omp parallel for collapse(2) schedule(static) {par}", *["    " + t for t in tiles]]
    else:
        lines += _layernorm_loops(ln, ops, ln_params, n, blocks, panels, par, rows_of, tile, tiles)
    lines.append("}")
    return GroupKernel(name, "\n".join(lines) + "\n", [rows, shape[1]] if heads else [rows],
                       tuple(graph.types[gg.outputs[0]].shape), [a_name, packed_name(gg)] + ops.ptrs + ln_params,
                       list(gg.outputs), [np.dtype(graph.types[o].dtype) for o in gg.outputs])


def _layernorm_loops(ln: Node, ops: _Operands, ln_params: list, n: int, blocks: str, panels: int, par: str,
                     rows_of: list, tile: list, tiles: list) -> list:
    """The loops of a product whose rows a LayerNormalization then normalises in place. With enough row blocks
    for every thread, each block is normalised right after its tiles, in cache; otherwise the tiles are shared
    out first and the rows normalised after a barrier (a batch-1 request still uses every thread)."""
    eps = c_float(float(ln.attrs.get("epsilon", 1e-5)))
    scale = f"i{2 + len(ops.ptrs)}"
    bias = f"i{3 + len(ops.ptrs)}" if len(ln_params) > 1 else "NULL"
    norm = f"ds_layernorm_row(o0 + r * {n}, o0 + r * {n}, {scale}, {bias}, {n}, {eps});"
    return [f"    if ({blocks} >= 2 * omp_get_max_threads()) {{",
            f"        #pragma omp parallel for schedule(static) {par}",
            f"        for (int64_t rb = 0; rb < {blocks}; rb++) {{", *["            " + t for t in rows_of],
            f"            for (int64_t q = 0; q < {panels}; q++) {{", *["                " + t for t in tile],
            "            }", f"            for (int64_t r = r0; r < r1; r++) {norm}", "        }",
            "    } else {", f"        #pragma omp parallel {par}", "        {",
            "        #pragma omp for collapse(2) schedule(static)", *["        " + t for t in tiles],
            "        #pragma omp for schedule(static)", f"        for (int64_t r = 0; r < L0; r++) {norm}",
            "        }", "    }"]


def emit_attention(ag: AttentionGroup, graph: Graph, name: str, key_names: set) -> GroupKernel | None:
    """C for softmax(pre(Q @ KT)) @ V: per batch matrix, KT and V are packed once, then 64 query rows at a time
    go through our micro-kernels into a row block that stays in cache for the softmax."""
    sg = ag.softmax
    shape = tuple(sg.shape)
    out_shape = tuple(graph.types[ag.outputs[0]].shape)
    folded = bool(ag.folded) and len(shape) == 4
    if ag.folded and not folded:
        return None
    # O as (batch, heads, seq, d), or with its Transpose folded as (batch, seq, heads, d): row stride heads * d
    out_at = "o0 + ((b / L1 * M + m0) * L1 + b % L1) * DV, L1 * DV" if folded else "o0 + (b * M + m0) * DV, DV"
    q_name, kt_name, v_name = ag.inputs[:3]
    k_dim, dv = graph.types[q_name].shape[-1], graph.types[v_name].shape[-1]
    if not all(_computable(t, key_names) for t in (shape, out_shape, (k_dim, dv))):
        return None
    ops = _operands(ag.inputs[3:], shape, graph)
    if ops is None:
        return None
    rank = len(shape)
    n = rank
    lines = [f"void {name}(const int64_t *d, float *restrict o0, const float *restrict i0, "
             "const float *restrict i1, const float *restrict i2"
             + "".join(f", const {_ctype(graph, x)} *restrict i{j + 3}" for j, x in enumerate(ops.ptrs)) + ") {"]
    loop_dims = [*shape, k_dim, dv]  # every dim its own level: a row's operand offsets come from its indices
    _dims_prologue(loop_dims, lines)
    spans = [list(p) for p in ops.patterns]
    ptr = {j: f"i{j + 3}" for j in range(len(ops.ptrs))}
    for j, span in enumerate(spans):
        for i in range(n):
            inner = [f"L{m}" for m in range(i + 1, n) if span[m]]
            lines.append(f"    const int64_t S{j}_{i} = {(' * '.join(inner) or '1') if span[i] else '0'};")
    M, N, K, DV = f"L{n - 2}", f"L{n - 1}", f"L{n}", f"L{n + 1}"
    nb = " * ".join(f"L{i}" for i in range(n - 2)) or "1"
    # per batch matrix: KT and V packed once (rows 2 KiB apart would alias in L1), then blocks of query rows
    lines += [f"    const int64_t NB = {nb}, M = {M}, N = {N}, K = {K}, DV = {DV};",
              f"    const int64_t NP = (N + {NR - 1}) / {NR}, DP = (DV + {NR - 1}) / {NR};",
              f"    #pragma omp parallel if(NB * M * N * (K + DV) >= {PAR_MIN_FLOPS})", "    {",
              f"    float *kp = (float *)malloc(sizeof(float) * (K * NP * {NR} + 1));",
              f"    float *vp = (float *)malloc(sizeof(float) * (N * DP * {NR} + 1));",
              f"    float *sb = (float *)malloc(sizeof(float) * ({ROW_BLOCK} * N + 1));",
              f"    float scale[{ROW_BLOCK}];",
              "    #pragma omp for schedule(static)",
              "    for (int64_t b = 0; b < NB; b++) {",
              "        ds_pack_panels_t(i1 + b * N * K, K, K, N, kp);" if ag.k_rows else
              "        ds_pack_panels(i1 + b * K * N, N, K, N, kp);",
              "        ds_pack_panels(i2 + b * N * DV, DV, N, DV, vp);",
              f"        for (int64_t m0 = 0; m0 < M; m0 += {ROW_BLOCK}) {{",
              f"            const int64_t m1 = m0 + {ROW_BLOCK} < M ? m0 + {ROW_BLOCK} : M;",
              "            for (int64_t q = 0; q < NP; q++)",
              "                ds_gemm_tile(i0 + (b * M + m0) * K, K, kp, sb, N, 0, m1 - m0, q, N, K);",
              "            for (int64_t m = m0; m < m1; m++) {",
              "                float *row = sb + (m - m0) * N;",
              "                int64_t rest = b * M + m;"]
    ind = "                "
    for i in range(n - 2, -1, -1):
        lines.append(f"{ind}const int64_t a{i} = rest % L{i}; rest /= L{i};")
    lines.append(f"{ind}(void)rest;")
    base = {j: " + ".join(f"a{i} * S{j}_{i}" for i in range(n - 1)) for j in range(len(ops.ptrs))}
    inner = ind + "    "

    def load(nodes: list, extra: tuple) -> dict:
        env = dict(ops.scalars)
        used = {z for nd in nodes for z in nd.inputs}
        for j, z in enumerate(ops.ptrs):
            if z in used:
                lines.append(f"{inner}const {_ctype(graph, z)} v{j} = {ptr[j]}[{base[j]} + c * S{j}_{n - 1}];")
                env[z] = f"v{j}"
        return env

    defer = _deferrable(sg, graph)
    _softmax_passes(sg, graph, lines, ind, "c", "N", load, {ag.scores.outputs[0]: "row[c]"},
                    lambda env: [f"row[c] = {env[sg.outputs[0]]};"], "scale[m - m0]" if defer else None)
    lines += ["            }",
              "            for (int64_t q = 0; q < DP; q++)",
              "                ds_gemm_tile(sb, N, vp, " + out_at + ", 0, m1 - m0, q, DV, N);"]
    if defer:  # rows of O times their softmax scale
        o_row, ldc = out_at.split(", ")
        lines += ["            for (int64_t m = m0; m < m1; m++) {",
                  f"                float *o = {o_row} + (m - m0) * {ldc};",
                  "                #pragma omp simd",
                  "                for (int64_t j = 0; j < DV; j++) o[j] *= scale[m - m0];", "            }"]
    lines += ["        }", "    }", "    free(kp);", "    free(vp);", "    free(sb);", "    }", "}"]
    return GroupKernel(name, "\n".join(lines) + "\n", loop_dims, out_shape, ag.inputs[:3] + ops.ptrs,
                       list(ag.outputs), [np.dtype(graph.types[o].dtype) for o in ag.outputs])


def make_step(k: GroupKernel, lib: ctypes.CDLL, symbols: list):
    """The Python side of a kernel: `fn(args, key) -> outputs` (args in k.inputs order)."""
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
    out_dtypes = k.out_dtypes

    def step(args, key):
        dyn_vals, shape = dims(key)
        d = np.array(dyn_vals, dtype=np.int64)
        outs = [np.empty(shape, dt) for dt in out_dtypes]
        ins = [np.ascontiguousarray(a) for a in args]
        fn(d.ctypes.data, *[o.ctypes.data for o in outs], *[a.ctypes.data for a in ins])
        return outs

    fn.argtypes = [ctypes.c_void_p] * (1 + len(k.outputs) + len(k.inputs))
    step.raw = (k, fn, dims)  # for memory-planned execution: the kernel, its C entry, its dims(key)
    return step
