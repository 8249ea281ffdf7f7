"""A `QProduct` item (passes/qproduct.py) as one kernel: the activation quantized once per call, then tiles of
ROW_BLOCK rows x 32 columns of u8 x s8 products (csrc/ds_gemm_int8.c), each dequantized and finished by the
epilogue (bias, GELU, residual) while in cache, OpenMP over tiles as the float products (lower/product.py).

The quantizing pass is the kernel's first statement, not a step of its own: DynamicQuantizeLinear's scale comes from
the minimum and maximum of the whole activation, so every tile must wait for it; the uint8 rows and their sums go
to the calling thread's scratch (m x ceil(k / 4) * 4 bytes), which the tiles of that call read.
"""

from __future__ import annotations

import numpy as np

from dynshape.codegen import int8, kir
from dynshape.codegen.lower.operands import computable, operands, prod
from dynshape.codegen.lower.product import block_rows, epilogue_loop, panel_columns, row_blocks
from dynshape.codegen.lowering import LowerCtx, Lowered, PackedWeight, Unsupported, register_lowering
from dynshape.codegen.packed_gemm import NR
from dynshape.ir.graph import Node
from dynshape.passes.qproduct import QProduct
from dynshape.passes.values import row_pattern

I64 = kir.I64


def _i(x: int) -> kir.Const:
    return kir.Const(x, I64)


def lower_qproduct(pr: QProduct, ctx: LowerCtx) -> Lowered:
    g, node, shape = ctx.graph, pr.node, tuple(pr.shape)
    computable(shape, ctx.key_names)
    x_name, w_name, zp_name, sc_name = node.inputs
    w = g.initializers.get(w_name)
    if w is None or w.dtype != np.int8 or w.ndim != 2:
        raise Unsupported("the weights are not a constant int8 matrix")
    k, n = w.shape
    if k <= 0 or n <= 0:
        raise Unsupported(f"the contraction ({k}) and output ({n}) widths must be positive")
    if any(np.dtype(g.types[o].dtype) != np.float32 for o in pr.outputs):
        raise Unsupported("the result is not float32")
    rows = prod(shape, list(range(len(shape) - 1)))
    y = node.outputs[0]
    extra = list(pr.inputs[4:])
    ops = operands(extra, shape, g, first_param=4)
    if not all(row_pattern(p) for p in ops.patterns):
        raise Unsupported("an epilogue operand is neither a full tensor, a row vector nor one value")
    o0 = kir.Buffer("o0", kir.F32, const=False)
    a, bp = kir.Buffer("i0"), kir.Buffer("i1")
    zp, sc = kir.Buffer("i2", kir.I32), kir.Buffer("i3")
    L0 = kir.Extent(0)
    q, r, j = kir.Var("q"), kir.Var("r"), kir.Var("j")
    act = kir.Var("act", "ptr")
    at_index = kir.Bin("+", kir.Bin("*", r, _i(n)), j)
    lets, cols = panel_columns(q, n)
    # the epilogue sees the product as a MatMul's result (no bias of its own)
    as_matmul = Node("MatMul", "", node.name, {}, [x_name, w_name], [y])
    epilogue = epilogue_loop(g, ops, as_matmul, pr.epilogue, pr.outputs[0], o0, at_index, r, j, cols, n)
    epilogue = [*lets, *epilogue] if epilogue else []
    nblk = kir.Var("NBLK")
    rb, r0, r1, rows_of = block_rows(nblk, L0)
    tile: list[kir.Stmt] = [kir.Eval(kir.Call("ds_q8_block", (act, kir.Addr(bp), kir.Addr(o0), _i(n), r0, r1, q, _i(n),
                                                              _i(k), kir.Addr(zp), kir.Addr(sc)), "void"))]
    if epilogue:
        tile.append(kir.For(r, r1, tuple(epilogue), start=r0))
    panels = (n + NR - 1) // NR
    par = kir.Bin(">=", kir.Bin("*", L0, _i(n * k)), _i(ctx.options.par_min_flops))
    if n * k >= ctx.options.par_min_weights:
        par = kir.Const(1, I64)
    body: list[kir.Stmt] = [
        kir.Let(act, kir.Call("ds_q8_quantize", (kir.Addr(a), L0, _i(k)), "ptr")),
        kir.Let(nblk, row_blocks(L0)),
        kir.For(rb, nblk, (kir.For(q, _i(panels), (*rows_of, *tile)),),
                omp=kir.Omp(parallel=True, collapse=2, if_=par)),
    ]
    kernel = kir.Kernel(ctx.name, (rows,), (o0,), (a, bp, zp, sc, *ops.buffers), tuple(body), ctx.symbols)
    weight = PackedWeight(w_name, False, layout="q8")
    return Lowered(kernel, pr.outputs, (x_name, weight, zp_name, sc_name, *ops.ptrs), needs=("packed_gemm_int8",),
                   method=int8.method())


register_lowering("qproduct", "kernel", lower_qproduct)
