"""A `Product` item as one kernel: a product by a packed constant matrix, its epilogue applied to each block of
rows while it is in cache.

Tiles are ROW_BLOCK rows x 32 columns (one packed panel), run by dynshape's micro-kernels (csrc/ds_gemm.c),
OpenMP over tiles. The last block of rows also takes a short tail (64 rows are one block of 64, not 60 + 4:
the weights are not streamed again for 4 rows). With folded head transposes, (b, s, heads * d) is written as
(b, heads, s, d) directly; with a LayerNormalization, rows are normalised per block when there are enough
blocks for every thread, else after all tiles (a batch-1 request still uses every thread).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from dynshape.codegen import bf16, kir
from dynshape.codegen.kir import i64
from dynshape.codegen.lower.elementwise import emit_nodes
from dynshape.codegen.lower.operands import Operands, computable, operands, prod
from dynshape.codegen.lower.softmax import softmax_passes
from dynshape.codegen.lowering import ROW_STRIDE, LowerCtx, Lowered, PackedWeight, Unsupported, register_lowering
from dynshape.codegen.packed_gemm import NR, ROW_BLOCK, ROW_TAIL
from dynshape.ir.graph import Graph, Node, upper_bound
from dynshape.passes.items import Elementwise, Product, Softmax
from dynshape.passes.values import row_pattern
from dynshape.sym import sym

I64 = kir.I64
INPLACE_MAX_ROWS = 8  # products with at most this many rows (see reads_in_place)
INPLACE_MIN_BYTES = 4 << 20  # and weights this large



_call = kir.call_void


ROW_ALIGN = 4  # balanced row blocks start at multiples of this (every micro-tile height is a multiple of 4)


class RowTiling(NamedTuple):
    """How a product's rows are cut into blocks: `block` rows each, a last block of up to `tail` more rows joined
    to the one before it, balanced blocks starting at multiples of `align`."""

    block: int
    tail: int
    align: int


FLOAT_TILING = RowTiling(ROW_BLOCK, ROW_TAIL, ROW_ALIGN)
# AMX's tiles take 16 rows (csrc/ds_gemm_bf16.c: 32 at a time, then 16, the rest on VDPBF16PS): blocks of 60 left
# 12 rows of every block to the vector micro-tiles, 4x slower a row (bert_small 8 x 128: 27% of the call there)
AMX_TILING = RowTiling(64, 16, 16)


def row_tiling(ctx: LowerCtx) -> RowTiling:
    """The row blocks of a product under the build's options on this CPU: AMX's where bf16 runs on AMX tiles."""
    return AMX_TILING if bf16.amx_tiles(ctx.options) else FLOAT_TILING


def plain_blocks(m: kir.Expr, t: RowTiling = FLOAT_TILING) -> kir.Expr:
    """The number of blocks of t.block rows in m rows, the last one also taking a short tail."""
    short_tail = kir.Bin("&&", kir.Bin(">", m, i64(t.block)), kir.Bin("<=", kir.Bin("%", m, i64(t.block)),
                                                                       i64(t.tail)))
    return kir.Select(short_tail, kir.Bin("/", m, i64(t.block)),
                      kir.Bin("/", kir.Bin("+", m, i64(t.block - 1)), i64(t.block)))


def row_blocks(nblk: kir.Var, bal: kir.Var, m: kir.Expr, par: kir.Expr, t: RowTiling = FLOAT_TILING
               ) -> list[kir.Stmt]:
    """NBLK, the number of row blocks of m rows, and `bal` (see block_rows). On one thread (or `par` false): blocks
    of t.block rows, the last one also taking a short tail. On T threads, from T such blocks on: as many blocks as
    a multiple of T, of equal size to t.align rows, where each keeps t.align rows or more (`bal` = 1). Why: the
    threads take equal runs of tiles, so 128 rows in blocks of 60 + 68 left one thread 60 rows while the other did
    68, and 512 rows in eight of 60 and one of 32 gave one thread 270 rows and the other 242 (the conv tiles' fix,
    conv.py's NBLK). Fewer blocks than threads stay as they are: the threads then share one block's panels, each
    streaming part of the weights; cut into blocks of rows, each streamed all of them (8 rows by 16 MB of weights,
    a text recogniser's classifier at 2 threads: 0.77 -> 1.14 ms)."""
    nb0, threads = kir.Var("NB0"), kir.Var("NT")
    nbt = (nb0 + threads - 1) / threads * threads
    return [kir.Let(threads, kir.Select(par, kir.Call("omp_get_max_threads", (), I64), i64(1))),
            kir.Let(nb0, plain_blocks(m, t)),
            kir.Let(bal, kir.Select(kir.Bin("&&", kir.Bin("&&", threads > 1, nb0 >= threads), nbt * t.align <= m),
                                    i64(1), i64(0))),
            kir.Let(nblk, kir.Select(bal, nbt, nb0))]


def block_rows(nblk: kir.Var, bal: kir.Var, m: kir.Expr, t: RowTiling = FLOAT_TILING
               ) -> tuple[kir.Var, kir.Var, kir.Var, list[kir.Stmt]]:
    """Row block rb of m rows (`nblk` and `bal` set by row_blocks): its first and end rows r0, r1, as (rb, r0, r1,
    the statements that set r0 and r1). Blocks of t.block rows, the last taking the short tail; balanced (`bal`):
    block b starts at b * m / NBLK down to a multiple of t.align, the last ends at m."""
    rb, r0, r1 = kir.Var("rb"), kir.Var("r0"), kir.Var("r1")

    def start(b: kir.Expr) -> kir.Expr:
        return kir.Select(bal, b * m / nblk / t.align * t.align, b * t.block)

    return rb, r0, r1, [kir.Let(r0, start(rb)),
                        kir.Let(r1, kir.Select(kir.Bin("==", rb, kir.Bin("-", nblk, i64(1))), m,
                                               kir.Select(bal, start(rb + 1), r0 + t.block)))]


def epilogue_loop(g: Graph, ops: Operands, node: Node, group: Elementwise | None, out_name: str, at_buf: kir.Buffer,
                  at_index: kir.Expr, r: kir.Var, j: kir.Var, cols: tuple[kir.Expr, kir.Expr], n: int,
                  channel: kir.Expr | None = None, fns: Mapping[str, str] | None = None) -> list[kir.Stmt]:
    """The epilogue of row r (a product row, a convolution's output pixel), columns cols[0] <= j < cols[1], in cache:
    the product's own bias (Gemm's alpha / beta C, a convolution's bias), then the elementwise group, stored
    back where the tile is (`at_buf[at_index]`). Operands are indexed as full rows (`r * n + j`: row-major with
    n columns), row vectors (`channel`, by default `j`: per output channel) or one value. Empty when there is
    nothing to apply. A caller whose j runs over several pixels' values at once (r their first pixel) passes
    `channel` = j % n. `fns`: math functions the elementwise group swaps (emit_nodes; bf16.epilogue_math)."""
    acc = kir.Var("acc", kir.F32)
    body: list[kir.Stmt] = [kir.Let(acc, kir.Load(at_buf, at_index))]
    env: dict[str, kir.Expr] = dict(ops.scalars)
    for jj, (x, buf) in enumerate(zip(ops.ptrs, ops.buffers)):
        pat = ops.patterns[jj]
        per_channel = j if channel is None else channel
        idx = kir.Bin("+", kir.Bin("*", r, i64(n)), j) if all(pat) and len(pat) > 1 else \
            (per_channel if pat[-1] else i64(0))
        v = kir.Var(f"v{jj}", buf.dtype)
        body.append(kir.Let(v, kir.Load(buf, idx)))
        env[x] = v
    value: kir.Expr = acc
    alpha = float(node.attrs.get("alpha", 1.0)) if node.op_type == "Gemm" else 1.0
    beta = float(node.attrs.get("beta", 1.0)) if node.op_type == "Gemm" else 1.0
    if alpha != 1.0:
        value = kir.Bin("*", kir.Const(alpha, kir.F32), acc)
    if len(node.inputs) > 2 and node.inputs[2] and beta != 0.0:  # Gemm's C, a convolution's bias
        c = env[node.inputs[2]]
        value = kir.Bin("+", value, c if beta == 1.0 else kir.Bin("*", kir.Const(beta, kir.F32), c))
    env[node.outputs[0]] = value
    if group:
        emit_nodes(group.nodes, env, g, body, "", fns)
    out = env[out_name]
    if out is acc:
        return []
    return [kir.For(j, cols[1], (*body, kir.Store(at_buf, at_index, out)), start=cols[0],
                    omp=kir.Omp(simd=True, schedule=None))]


def seq_blocks(nblk: kir.Var, rb: kir.Var, r0: kir.Var, r1: kir.Var, m: kir.Expr,
               seq: kir.Expr, t: RowTiling = FLOAT_TILING) -> tuple[list[kir.Stmt], list[kir.Stmt]]:
    """Row blocks of a heads-folded product's m = batch * seq rows taken within each b (plain_blocks(seq, t) per b), as
    (the statements that set NBLK, those that set block rb's r0 and r1). A block across two b's is computed in two
    parts; a bf16 tile rounds its rows for each part, so the per-thread memo of rounded rows (csrc/ds_gemm_bf16.c)
    missed on every panel, alternating between them (bert_small at batch 8 x 128: 4% on the QKV products)."""
    bps, bb, jb = kir.Var("BPS"), kir.Var("bb"), kir.Var("jb")
    nb = kir.Select(kir.Bin(">", seq, i64(0)), kir.Bin("*", kir.Bin("/", m, seq), bps), i64(0))
    last = kir.Bin("==", jb, kir.Bin("-", bps, i64(1)))
    end = kir.Select(last, kir.Bin("*", kir.Bin("+", bb, i64(1)), seq), kir.Bin("+", r0, i64(t.block)))
    return ([kir.Let(bps, plain_blocks(seq, t)), kir.Let(nblk, nb)],
            [kir.Let(bb, kir.Bin("/", rb, bps)), kir.Let(jb, kir.Bin("%", rb, bps)),
             kir.Let(r0, kir.Bin("+", kir.Bin("*", bb, seq), kir.Bin("*", jb, i64(t.block)))), kir.Let(r1, end)])


def panel_columns(q: kir.Var, n: int) -> tuple[list[kir.Stmt], tuple[kir.Expr, kir.Expr]]:
    """The columns of panel q of an n-column product: [q * 32, min(q * 32 + 32, n))."""
    j1 = kir.Var("j1")
    panel_end = kir.Bin("+", kir.Bin("*", q, i64(NR)), i64(NR))
    return [kir.Let(j1, kir.Select(kir.Bin("<", panel_end, i64(n)), panel_end, i64(n)))], (kir.Bin("*", q, i64(NR)), j1)


def reads_in_place(pr: Product, g: Graph, rows: Any, k: int, n: int, ctx: LowerCtx) -> bool:
    """Whether the product reads its weight (n, k) in place (csrc/ds_gemm.c: ds_gemm_block_nt) rather than packed:
    a transposed float32 weight of at least INPLACE_MIN_BYTES whose products never have more than INPLACE_MAX_ROWS
    rows over the declared ranges. There the weights stream from memory once a call, which in-place rows do
    faster than a packed panel, and the build keeps no packed copy; with more rows the products reuse each
    weight and the packed micro-tiles compute faster (at 64 rows, 25088 x 4096: 174 ms packed, 216 in place)."""
    if not (ctx.options.inplace_weights and pr.trans_b):
        return False
    w = g.initializers.get(pr.weight)
    if w is None:
        w = getattr(g.types.get(pr.weight), "value", None)
    hi = upper_bound(rows)
    return (isinstance(w, np.ndarray) and w.dtype == np.float32 and w.shape == (n, k)
            and w.nbytes >= INPLACE_MIN_BYTES and hi is not None and hi <= INPLACE_MAX_ROWS)


def softmax_rows(sm: Softmax, g: Graph, sm_in: str, sm_ops: Operands, at: kir.Expr, n: int) -> tuple[kir.Stmt, ...]:
    """The softmax (with its groups) of one product row of n columns at `at`, in place: the row is its own
    scratch (each pass reads and writes one column at a time), its operands row vectors or scalars."""
    row = kir.Buffer("srow", kir.F32, const=False)

    def load(nodes: tuple, extra: tuple, c: kir.Var) -> tuple[list[kir.Stmt], dict[str, kir.Expr]]:
        env: dict[str, kir.Expr] = dict(sm_ops.scalars)
        used = {x for nd in nodes for x in nd.inputs} | set(extra)
        stmts: list[kir.Stmt] = []
        for jj, (x, buf) in enumerate(zip(sm_ops.ptrs, sm_ops.buffers)):
            if x in used:
                v = kir.Var(f"s{jj}", buf.dtype)
                stmts.append(kir.Let(v, kir.Load(buf, c if sm_ops.patterns[jj][-1] else i64(0))))
                env[x] = v
        return stmts, env

    body: list[kir.Stmt] = [kir.Pointer(row, at)]
    softmax_passes(sm, g, body, "c", i64(n), row, load, {sm_in: lambda c: kir.Load(row, c)},
                   lambda c, env: [kir.Store(row, c, env[sm.outputs[0]])])
    return tuple(body)


def lower_product(pr: Product, ctx: LowerCtx) -> Lowered:
    g, node, shape = ctx.graph, pr.node, tuple(pr.shape)
    computable(shape, ctx.key_names)
    a_name = node.inputs[0]
    k = g.types[a_name].shape[-1]
    n = shape[-1] if shape else 1
    if not isinstance(k, int) or not isinstance(n, int) or k <= 0 or n <= 0:
        raise Unsupported(f"the contraction ({k}) and output ({n}) widths must be static and positive")
    rows = prod(shape, list(range(len(shape) - 1)))
    ln, sm = pr.layernorm, pr.softmax
    ln_params = [x for x in ln.inputs[1:3] if x] if ln is not None else []
    # the value the softmax reads from the product (its epilogue's result, if any), and its own operands
    sm_in = (pr.epilogue.outputs[0] if pr.epilogue else node.outputs[0]) if sm is not None else ""
    sm_params = [x for x in pr.inputs if x in set(sm.inputs) - {sm_in}] if sm is not None else []
    # the product's own operands (Gemm's C, the epilogue's): a softmax-only operand is the softmax's alone
    extra = [x for x in pr.inputs[1:len(pr.inputs) - len(ln_params)] if x not in sm_params or
             (pr.epilogue and x in pr.epilogue.inputs) or x in node.inputs]
    ops = operands(extra, shape, g, first_param=2)
    if not all(row_pattern(p) for p in ops.patterns):
        raise Unsupported("an epilogue operand is neither a full tensor, a row vector nor one value")
    if any(np.dtype(g.types[x].dtype) != np.float32 for x in pr.outputs):
        raise Unsupported("the result is not float32")
    if pr.folded and not (len(shape) == 3 and pr.heads and n % pr.heads == 0):
        raise Unsupported(f"head folding needs (b, s, heads * d) with d whole; got {shape} for {pr.heads} heads")
    if (ln is not None or sm is not None) and pr.folded:
        raise Unsupported("a layer norm or softmax of heads-transposed rows")
    sm_ops = operands(sm_params, shape, g, first_param=2 + len(ops.ptrs))
    if sm is not None and not all(not any(p[:-1]) for p in sm_ops.patterns):
        raise Unsupported("a softmax operand is neither a row vector nor one value")
    o0 = kir.Buffer("o0", kir.F32, const=False)
    a, bp = kir.Buffer("i0"), kir.Buffer("i1")
    ln_bufs = [kir.Buffer(f"i{2 + len(ops.ptrs) + j}") for j in range(len(ln_params))]
    heads = pr.heads if pr.folded else 0
    low = bf16.layout_of(ctx.options)  # bf16 panels (pairs along k), rounded float32 panels, or None: float32
    in_place = not heads and not low and reads_in_place(pr, g, rows, k, n, ctx)
    block_fn, panel_fn = bf16.product_calls(ctx.options) if low else ("ds_gemm_block", "ds_gemm_panel")
    # the tile calls of a bf16 product carry the call's epoch: each thread rounds a block of A's rows once for
    # all the panels it computes in this call (csrc/ds_gemm_bf16.c)
    ep = kir.Var("ep")
    low_args = (ep,) if low else ()
    panel_floats = -(-k // 2) * NR if low == "bf16" else k * NR  # one panel, in floats
    strided = not heads and ln is None and sm is None  # plain rows: their stride is a key slot (a Concat's slice)
    ext = [rows, shape[1]] if heads else [rows, sym(ROW_STRIDE)] if strided else [rows]
    L0 = kir.Extent(0)
    ldy: kir.Expr = kir.Extent(1) if strided else i64(n)
    q, r, j = kir.Var("q"), kir.Var("r"), kir.Var("j")
    hd = n // heads if heads else 0
    dst = kir.Buffer("dst", kir.F32, const=False)
    rs = kir.Var("rs")
    if heads:
        at_index = kir.Bin("-", kir.Bin("+", kir.Bin("*", kir.Bin("-", r, rs), i64(hd)), j), kir.Bin("*", q, i64(NR)))
        at_buf = dst
    else:
        at_index, at_buf = kir.Bin("+", kir.Bin("*", r, ldy), j), o0
    # the value before the folded reshapes or the LayerNormalization
    out_name = pr.folded[0].inputs[0] if pr.folded else ln.inputs[0] if ln is not None else sm_in if sm is not None \
        else pr.outputs[0]
    lets, cols = panel_columns(q, n)
    epilogue = epilogue_loop(g, ops, node, pr.epilogue, out_name, at_buf, at_index, r, j, cols, n,
                             fns=bf16.epilogue_math(ctx.options))
    epilogue = [*lets, *epilogue] if epilogue else []
    nblk, bal = kir.Var("NBLK"), kir.Var("BAL")
    tiling = row_tiling(ctx)
    rb, r0, r1, rows_of = block_rows(nblk, bal, L0, tiling)
    if heads:  # rows of one b at a time, straight into their place in (b, heads, s, hd)
        L1 = kir.Extent(1)
        h, d0, nc = kir.Var("h"), kir.Var("d0"), kir.Var("nc")
        b, sq, re = kir.Var("b"), kir.Var("s"), kir.Var("re")
        rest = kir.Bin("-", i64(n), kir.Bin("*", q, i64(NR)))
        next_b = kir.Bin("*", kir.Bin("+", b, i64(1)), L1)
        tile = [kir.Let(h, kir.Bin("/", kir.Bin("*", q, i64(NR)), i64(hd))),
                kir.Let(d0, kir.Bin("%", kir.Bin("*", q, i64(NR)), i64(hd))),
                kir.Let(nc, kir.Select(kir.Bin("<", rest, i64(NR)), rest, i64(NR))),
                kir.Decl(rs, r0),
                kir.While(kir.Bin("<", rs, r1), (
                    kir.Let(b, kir.Bin("/", rs, L1)), kir.Let(sq, kir.Bin("%", rs, L1)),
                    kir.Let(re, kir.Select(kir.Bin("<", next_b, r1), next_b, r1)),
                    kir.Pointer(dst, kir.Addr(o0, kir.Bin("+", kir.Bin("*", kir.Bin(
                        "+", kir.Bin("*", kir.Bin("+", kir.Bin("*", b, i64(heads)), h), L1), sq), i64(hd)), d0))),
                    _call(panel_fn, kir.Addr(a, kir.Bin("*", rs, i64(k))), i64(k),
                          kir.Addr(bp, kir.Bin("*", q, i64(panel_floats))), *(() if low else (i64(NR),)),
                          kir.Addr(dst), i64(hd), i64(0), kir.Bin("-", re, rs), nc, i64(k), *low_args),
                    kir.For(r, re, tuple(epilogue), start=rs),
                    kir.Assign(rs, re)))]
    else:
        # rows r0..r1 of the whole product: the block at row 0 prefetches each panel (ds_gemm_block), or B's rows
        # read in place (ds_gemm_block_nt)
        tile = [_call("ds_gemm_block_nt" if in_place else block_fn, kir.Addr(a), i64(k), kir.Addr(bp),
                      kir.Addr(o0), ldy, r0, r1, q, i64(n), i64(k), *low_args)]
        if epilogue:
            tile.append(kir.For(r, r1, tuple(epilogue), start=r0))
    panels = (n + NR - 1) // NR
    par = kir.Bin(">=", kir.Bin("*", L0, i64(n * k)), i64(ctx.options.par_min_flops))
    if n * k >= ctx.options.par_min_weights:  # few rows, large weights: the threads share the stream
        par = kir.Const(1, I64)
    lines: list[kir.Stmt] = row_blocks(nblk, bal, L0, par, tiling)
    if heads and low:  # blocks within each b: see seq_blocks
        lines, rows_of = seq_blocks(nblk, rb, r0, r1, L0, kir.Extent(1), tiling)
    if low:
        lines.append(kir.Let(ep, kir.Call("ds_bf16_epoch", (), I64)))

    def tiles(omp: kir.Omp | None) -> kir.For:
        return kir.For(rb, nblk, (kir.For(q, i64(panels), (*rows_of, *tile)),), omp=omp)

    if sm is not None:
        def normalise(rr: kir.Var) -> tuple[kir.Stmt, ...]:
            return softmax_rows(sm, g, sm_in, sm_ops, kir.Addr(o0, kir.Bin("*", rr, i64(n))), n)

        rr, rr2 = kir.Var("r"), kir.Var("r")
        per_block = kir.For(rb, nblk, (*rows_of, kir.For(q, i64(panels), tuple(tile)),
                                       kir.For(rr, r1, normalise(rr), start=r0)), omp=kir.Omp(parallel=True, if_=par))
        after = kir.Region((tiles(kir.Omp(shared=True, collapse=2)),
                            kir.For(rr2, L0, normalise(rr2), omp=kir.Omp(shared=True))), if_=par)
        threads = kir.Call("omp_get_max_threads", (), I64)
        lines.append(kir.If(kir.Bin(">=", nblk, kir.Bin("*", i64(2), threads)), (per_block,), (after,)))
    elif ln is None:
        lines.append(tiles(kir.Omp(parallel=True, collapse=2, if_=par)))
    else:
        eps = kir.Const(float(ln.attrs.get("epsilon", 1e-5)), kir.F32)
        scale = kir.Addr(ln_bufs[0])
        bias = kir.Addr(ln_bufs[1]) if len(ln_bufs) > 1 else kir.NULL
        rr = kir.Var("r")
        row_at = kir.Addr(o0, kir.Bin("*", rr, i64(n)))
        ln_fn = bf16.layernorm_row(ctx.options)
        norm = (_call(ln_fn, row_at, row_at, scale, bias, i64(n), eps),)
        per_block = kir.For(rb, nblk, (*rows_of, kir.For(q, i64(panels), tuple(tile)), kir.For(rr, r1, norm, start=r0)),
                            omp=kir.Omp(parallel=True, if_=par))
        rr2 = kir.Var("r")
        norm2 = (_call(ln_fn, kir.Addr(o0, kir.Bin("*", rr2, i64(n))),
                       kir.Addr(o0, kir.Bin("*", rr2, i64(n))), scale, bias, i64(n), eps),)
        after = kir.Region((tiles(kir.Omp(shared=True, collapse=2)),
                            kir.For(rr2, L0, norm2, omp=kir.Omp(shared=True))), if_=par)
        threads = kir.Call("omp_get_max_threads", (), I64)
        lines.append(kir.If(kir.Bin(">=", nblk, kir.Bin("*", i64(2), threads)), (per_block,), (after,)))
    symbols = (*ctx.symbols, ROW_STRIDE) if strided else ctx.symbols
    kernel = kir.Kernel(ctx.name, tuple(ext), (o0,), (a, bp, *ops.buffers, *ln_bufs, *sm_ops.buffers), tuple(lines),
                        symbols)
    weight = pr.weight if in_place else PackedWeight(pr.weight, pr.trans_b, layout=low or "panels")
    needs = ("packed_gemm", "packed_gemm_bf16") if low else ("packed_gemm",)
    return Lowered(kernel, pr.outputs, (a_name, weight, *ops.ptrs, *ln_params, *sm_ops.ptrs), needs=needs,
                   row_stride=strided, method=bf16.method(ctx.options) if low else "")


register_lowering("product", "kernel", lower_product)
