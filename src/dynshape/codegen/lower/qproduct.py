"""A `QProduct` item (passes/qproduct.py) as one kernel: the activation quantized once per call, then tiles of
ROW_BLOCK rows x 32 columns of u8 x s8 products (csrc/ds_gemm_int8.c), each dequantized and finished by the
epilogue (bias, GELU, residual) while in cache, or requantized to 8 bits, OpenMP over tiles as the float products
(lower/product.py).

The quantizing pass is the kernel's first statement, not a step of its own: DynamicQuantizeLinear's scale comes from
the minimum and maximum of the whole activation, so every tile must wait for it; the uint8 rows and their sums go
to the calling thread's scratch (m x ceil(k / 4) * 4 bytes), which the tiles of that call read. A QuantizedMatMul's
activation is quantized with its compile-time scale and zero point (float32 x), or copied as it is (8-bit x: int8
shifted into uint8), into the same scratch; its scales are the per-column multipliers the tiles apply.
"""

from __future__ import annotations

import numpy as np

from dynshape.codegen import int8, kir
from dynshape.codegen.kir import i64
from dynshape.codegen.lower.operands import computable, operands, prod
from dynshape.codegen.lower.product import (
    AMX_TILING,
    FLOAT_TILING,
    block_rows,
    epilogue_loop,
    panel_columns,
    row_blocks,
)
from dynshape.codegen.lowering import LowerCtx, Lowered, PackedWeight, Unsupported, register_lowering
from dynshape.codegen.packed_gemm import NR
from dynshape.ir.graph import Node
from dynshape.passes.qproduct import QProduct
from dynshape.passes.values import row_pattern

I64 = kir.I64


def _scalar(g, name: str) -> np.ndarray:
    v = g.initializers.get(name)
    if v is None or v.size != 1:
        raise Unsupported(f"{name!r} is not a constant scalar")
    return np.asarray(v).reshape(-1)[0]


def lower_qproduct(pr: QProduct, ctx: LowerCtx) -> Lowered:
    g, node, shape = ctx.graph, pr.node, tuple(pr.shape)
    computable(shape, ctx.key_names)
    static = node.op_type == "QuantizedMatMul"
    if static:
        x_name, xs_name, xz_name, w_name, zp_name, sc_name = node.inputs[:6]
        yz_name = node.inputs[6] if len(node.inputs) > 6 and node.inputs[6] else None
    else:
        x_name, w_name, zp_name, sc_name = node.inputs
        yz_name = None
    w = g.initializers.get(w_name)
    if w is None or w.dtype != np.int8 or w.ndim != 2:
        raise Unsupported("the weights are not a constant int8 matrix")
    k, n = w.shape
    if k <= 0 or n <= 0:
        raise Unsupported(f"the contraction ({k}) and output ({n}) widths must be positive")
    out_dtype = np.dtype(np.float32) if yz_name is None else np.dtype(g.types[yz_name].dtype)
    if any(np.dtype(g.types[o].dtype) != out_dtype for o in pr.outputs):
        raise Unsupported(f"the result is not {out_dtype}")
    x_dtype = np.dtype(g.types[x_name].dtype)
    rows = prod(shape, list(range(len(shape) - 1)))
    y = node.outputs[0]
    first = len(node.inputs)
    extra = list(pr.inputs[first:])
    ops = operands(extra, shape, g, first_param=4)
    if not all(row_pattern(p) for p in ops.patterns):
        raise Unsupported("an epilogue operand is neither a full tensor, a row vector nor one value")
    o0 = kir.Buffer("o0", out_dtype.name, const=False)
    a, bp = kir.Buffer("i0", x_dtype.name), kir.Buffer("i1")
    zp, sc = kir.Buffer("i2", kir.I32), kir.Buffer("i3")
    L0 = kir.Extent(0)
    q, r, j = kir.Var("q"), kir.Var("r"), kir.Var("j")
    act = kir.Var("act", "ptr")
    at_index = kir.Bin("+", kir.Bin("*", r, i64(n)), j)
    lets, cols = panel_columns(q, n)
    # the epilogue sees the product as a MatMul's result (no bias of its own)
    as_matmul = Node("MatMul", "", node.name, {}, [x_name, w_name], [y])
    epilogue = epilogue_loop(g, ops, as_matmul, pr.epilogue, pr.outputs[0], o0, at_index, r, j, cols, n)
    epilogue = [*lets, *epilogue] if epilogue else []
    nblk, bal = kir.Var("NBLK"), kir.Var("BAL")
    tiling = AMX_TILING if int8.amx_tiles() else FLOAT_TILING  # AMX's tiles take 16 rows at a time
    rb, r0, r1, rows_of = block_rows(nblk, bal, L0, tiling)
    common = (act, kir.Addr(bp), kir.Addr(o0), i64(n), r0, r1, q, i64(n), i64(k), kir.Addr(zp), kir.Addr(sc))
    if yz_name is None:
        tile: list[kir.Stmt] = [kir.Eval(kir.Call("ds_q8_block", common, "void"))]
    else:
        yz = _scalar(g, yz_name)
        tile = [kir.Eval(kir.Call("ds_q8_block_rq", (*common, i64(int(yz)), i64(int(yz.dtype == np.int8))), "void"))]
    if epilogue:
        tile.append(kir.For(r, r1, tuple(epilogue), start=r0))
    if not static:
        fn = "ds_q8_quantize_tokens" if node.attrs.get("per_token", 0) else "ds_q8_quantize"
        quantize = kir.Call(fn, (kir.Addr(a), L0, i64(k)), "ptr")
    else:
        xz = _scalar(g, xz_name)
        signed = i64(int(xz.dtype == np.int8))
        if x_dtype == np.float32:
            xs = _scalar(g, xs_name)
            quantize = kir.Call("ds_q8_quantize_static", (kir.Addr(a), L0, i64(k), kir.Const(float(xs), kir.F32),
                                                          i64(int(xz)), signed), "ptr")
        else:
            quantize = kir.Call("ds_q8_load", (kir.Addr(a), L0, i64(k), i64(int(xz)), signed), "ptr")
    panels = (n + NR - 1) // NR
    par = kir.Bin(">=", kir.Bin("*", L0, i64(n * k)), i64(ctx.options.par_min_flops))
    if n * k >= ctx.options.par_min_weights:
        par = kir.Const(1, I64)
    body: list[kir.Stmt] = [
        kir.Let(act, quantize),
        *row_blocks(nblk, bal, L0, par, tiling),
        kir.For(rb, nblk, (kir.For(q, i64(panels), (*rows_of, *tile)),),
                omp=kir.Omp(parallel=True, collapse=2, if_=par)),
    ]
    kernel = kir.Kernel(ctx.name, (rows,), (o0,), (a, bp, zp, sc, *ops.buffers), tuple(body), ctx.symbols)
    weight = PackedWeight(w_name, False, layout="q8")
    how = int8.method() if yz_name is None else int8.method().replace("float32 scales and epilogue",
                                                                     "requantized to 8 bits")
    return Lowered(kernel, pr.outputs, (x_name, weight, zp_name, sc_name, *ops.ptrs), needs=("packed_gemm_int8",),
                   method=how)


register_lowering("qproduct", "kernel", lower_qproduct)
