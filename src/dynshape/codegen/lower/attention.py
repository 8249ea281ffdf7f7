"""An `Attention` item as one kernel: softmax(pre(Q @ KT)) @ V without materialising the scores.

Per batch matrix, KT and V are packed once (rows 2 KiB apart would alias in L1), then ROW_BLOCK query rows at a
time go through the micro-kernels into a row block that stays in cache for the softmax (at batch 8 x 512
tokens the scores would be 33 MB per layer). When the softmax's consumer is nothing or the NaN clean-up, rows
of O are scaled instead of a third pass over the scores; when KT is K with its last two axes swapped, KT's
panels are packed from K's rows; with a folded transpose, O is written as (batch, seq, heads, d). With at most
DECODE_ROWS query rows (a decoder step) nothing is packed: the scores are dot products with K's rows
(ds_dot_rows) and O a sum of V's rows (ds_axpy_rows), each key read once.
"""

from __future__ import annotations

from dynshape.codegen import bf16, kir
from dynshape.codegen.kir import i64
from dynshape.codegen.lower.operands import computable, operands
from dynshape.codegen.lower.product import AMX_TILING
from dynshape.codegen.lower.softmax import deferrable, softmax_passes
from dynshape.codegen.lowering import LowerCtx, Lowered, Unsupported, register_lowering
from dynshape.codegen.packed_gemm import NR, ROW_BLOCK
from dynshape.passes.items import Attention

I64 = kir.I64
DECODE_ROWS = 4  # query rows up to which K and V are read unpacked (a decoder step's one; a prefill's are many)
# V widths read in place by the S @ V product: exactly one panel's 16 (ds_gemm_rows' narrow path) or 32 columns,
# so no row is read past its end (a width between would read into the next row, and past V's last)
V_IN_PLACE = (16, NR)



_call = kir.call_void


def _mul(*xs: kir.Expr) -> kir.Expr:
    return kir.product(xs)


def lower_attention(at: Attention, ctx: LowerCtx) -> Lowered:
    g, sm = ctx.graph, at.softmax
    shape = tuple(sm.shape)
    out_shape = tuple(g.types[at.outputs[0]].shape)
    folded = bool(at.folded) and len(shape) == 4
    if at.folded and not folded:
        raise Unsupported("a folded output transpose needs 4-D scores")
    q_name, kt_name, v_name = at.inputs[:3]
    k_dim, dv = g.types[q_name].shape[-1], g.types[v_name].shape[-1]
    for t in (shape, out_shape, (k_dim, dv)):
        computable(t, ctx.key_names)
    ops = operands(at.inputs[3:], shape, g, first_param=3)
    n = len(shape)
    ext = (*shape, k_dim, dv)  # every dim its own level: a row's operand offsets come from its indices
    L = [kir.Extent(i) for i in range(len(ext))]
    body: list[kir.Stmt] = []
    table: list[list[kir.Var]] = []
    for j, span in enumerate(ops.patterns):
        row_s = []
        for i in range(n):
            v = kir.Var(f"S{j}_{i}")
            body.append(kir.Let(v, kir.product(L[m] for m in range(i + 1, n) if span[m]) if span[i] else i64(0)))
            row_s.append(v)
        table.append(row_s)
    NB, M, N, K, DV = (kir.Var(x) for x in ("NB", "M", "N", "K", "DV"))
    NP, DP = kir.Var("NP"), kir.Var("DP")
    body += [kir.Let(NB, kir.product(L[:n - 2])), kir.Let(M, L[n - 2]), kir.Let(N, L[n - 1]), kir.Let(K, L[n]),
             kir.Let(DV, L[n + 1]),
             kir.Let(NP, kir.Bin("/", kir.Bin("+", N, i64(NR - 1)), i64(NR))),
             kir.Let(DP, kir.Bin("/", kir.Bin("+", DV, i64(NR - 1)), i64(NR)))]
    o0 = kir.Buffer("o0", kir.F32, const=False)
    qb, kb, vb = kir.Buffer("i0"), kir.Buffer("i1"), kir.Buffer("i2")
    kp, vp, sb = (kir.Buffer(x, kir.F32, const=False) for x in ("kp", "vp", "sb"))
    scale = kir.Buffer("scale", kir.F32, const=False)
    b, m0, m1, m, q = (kir.Var(x) for x in ("b", "m0", "m1", "m", "q"))
    row = kir.Buffer("row", kir.F32, const=False)
    rest = kir.Var("rest")
    per_row: list[kir.Stmt] = [kir.Pointer(row, kir.Addr(sb, _mul(kir.Bin("-", m, m0), N))),
                               kir.Decl(rest, kir.Bin("+", kir.Bin("*", b, M), m))]
    idx: dict[int, kir.Var] = {}
    for i in range(n - 2, -1, -1):
        idx[i] = kir.Var(f"a{i}")
        per_row += [kir.Let(idx[i], kir.Bin("%", rest, L[i])), kir.Assign(rest, kir.Bin("/", rest, L[i]))]
    base = [kir.total(kir.Bin("*", idx[i], table[j][i]) for i in range(n - 1)) for j in range(len(ops.ptrs))]

    def load(nodes: tuple, extra: tuple, c: kir.Var) -> tuple[list[kir.Stmt], dict[str, kir.Expr]]:
        env: dict[str, kir.Expr] = dict(ops.scalars)
        used = {z for nd in nodes for z in nd.inputs}
        stmts: list[kir.Stmt] = []
        for j, z in enumerate(ops.ptrs):
            if z in used:
                v = kir.Var(f"v{j}", ops.buffers[j].dtype)
                stmts.append(kir.Let(v, kir.Load(ops.buffers[j], kir.Bin("+", base[j], kir.Bin("*", c,
                                                                                              table[j][n - 1])))))
                env[z] = v
        return stmts, env

    defer = deferrable(sm, g)
    rel = kir.Bin("-", m, m0)
    softmax_passes(sm, g, per_row, "c", N, row, load, {at.scores.outputs[0]: lambda c: kir.Load(row, c)},
                   lambda c, env: [kir.Store(row, c, env[sm.outputs[0]])], (scale, rel) if defer else None,
                   native_exp=ctx.options.fast_math, exp_sum=bf16.softmax_exp_sum(ctx.options))
    # O as (batch, heads, seq, d), or with its Transpose folded as (batch, seq, heads, d): row stride heads * d
    if folded:
        L1 = L[1]
        o_at = kir.Addr(o0, _mul(kir.Bin("+", _mul(kir.Bin("+", _mul(kir.Bin("/", b, L1), M), m0), L1),
                                         kir.Bin("%", b, L1)), DV))
        ldc: kir.Expr = _mul(L1, DV)
    else:
        o_at, ldc = kir.Addr(o0, _mul(kir.Bin("+", _mul(b, M), m0), DV)), DV
    # bf16: K and V packed as bf16 pairs (or rounded float32 panels), Q's rows and the scores rounded as the tiles
    # read them; the epoch lets a thread round a block of Q once for all of K's panels, and the scores, which the
    # next block overwrites in the same buffer, once for all of V's panels under an epoch of their own per block
    # (epoch 0, rounding them for every panel, was 2 roundings of every score at a head width of 64)
    pack_kn, pack_kt, tile_fn = bf16.attention_calls(ctx.options)
    low = bf16.active(ctx.options)
    rb = AMX_TILING.block if bf16.amx_tiles(ctx.options) else ROW_BLOCK  # AMX tiles: the products' blocks
    ep, sep = kir.Var("ep"), kir.Var("sep")
    q_args, s_args = ((ep,), (sep,)) if low else ((), ())
    block: list[kir.Stmt] = [
        kir.Let(m1, kir.Select(kir.Bin("<", kir.Bin("+", m0, i64(rb)), M), kir.Bin("+", m0, i64(rb)), M)),
        kir.For(q, NP, (_call(tile_fn, kir.Addr(qb, _mul(kir.Bin("+", _mul(b, M), m0), K)), K, kir.Addr(kp),
                              kir.Addr(sb), N, i64(0), kir.Bin("-", m1, m0), q, N, K, *q_args),)),
        kir.For(m, m1, tuple(per_row), start=m0)]
    q2 = kir.Var("q")
    # V of 16 or 32 columns is one panel as it lies (rows DV floats apart): the product reads it in place, where
    # packing it cost more than the product at small head dims (mobilevit's 144 x 16: 1.4 us of 2.8)
    v_in_place = not low and isinstance(dv, int) and dv in V_IN_PLACE
    v_at = kir.Addr(vb, _mul(b, N, DV))
    if low:
        block.append(kir.Let(sep, kir.Call("ds_bf16_epoch", (), I64)))
    block.append(_call("ds_gemm_panel", kir.Addr(sb), N, v_at, DV, o_at, ldc, i64(0), kir.Bin("-", m1, m0), DV, N)
                 if v_in_place else
                 kir.For(q2, DP, (_call(tile_fn, kir.Addr(sb), N, kir.Addr(vp), o_at, ldc, i64(0),
                                        kir.Bin("-", m1, m0), q2, DV, N, *s_args),)))
    scaled: list[kir.Stmt] = []
    if defer:  # rows of O times their softmax scale
        mm, jj = kir.Var("m"), kir.Var("j")
        o = kir.Buffer("o", kir.F32, const=False)
        rel2 = kir.Bin("-", mm, m0)
        scaled.append(kir.For(mm, m1, (
            kir.Pointer(o, kir.Addr(o0, kir.Bin("+", o_at.offset, _mul(rel2, ldc)))),
            kir.For(jj, DV, (kir.Store(o, jj, kir.Bin("*", kir.Load(o, jj), kir.Load(scale, rel2))),),
                    omp=kir.Omp(simd=True, schedule=None))), start=m0))
    block += scaled
    pack_k = (_call(pack_kt, kir.Addr(kb, _mul(b, N, K)), K, K, N, kir.Addr(kp)) if at.k_rows else
              _call(pack_kn, kir.Addr(kb, _mul(b, K, N)), N, K, N, kir.Addr(kp)))
    packed = (pack_k, *(() if v_in_place else (_call(pack_kn, v_at, DV, N, DV, kir.Addr(vp)),)),
              kir.For(m0, M, tuple(block), step=i64(rb)))
    # decode: a few query rows read K's and V's rows where they lie (packing them would be most of the work)
    q_row = kir.Addr(qb, _mul(kir.Bin("+", _mul(b, M), m), K))
    scores = (_call("ds_dot_rows", q_row, kir.Addr(kb, _mul(b, N, K)), N, K, kir.Addr(row)) if at.k_rows else
              _call("ds_axpy_rows", q_row, kir.Addr(kb, _mul(b, K, N)), K, N, kir.Addr(row)))
    m2 = kir.Var("m")
    direct: list[kir.Stmt] = [
        kir.Let(m0, i64(0)), kir.Let(m1, M),
        kir.For(m, m1, (per_row[0], scores, *per_row[1:]), start=m0),
        kir.For(m2, m1, (_call("ds_axpy_rows", kir.Addr(sb, _mul(m2, N)), kir.Addr(vb, _mul(b, N, DV)), N, DV,
                               kir.Addr(o0, kir.Bin("+", o_at.offset, _mul(m2, ldc)))),), start=m0),
        *scaled]  # the rows of O times their softmax scale, when deferred
    batch = kir.For(b, NB, (kir.If(kir.Bin("<=", M, i64(DECODE_ROWS)), tuple(direct), packed),),
                    omp=kir.Omp(shared=True))
    flops = kir.Bin(">=", _mul(NB, M, N, kir.Bin("+", K, DV)), i64(ctx.options.par_min_flops))
    if low:
        body.append(kir.Let(ep, kir.Call("ds_bf16_epoch", (), I64)))
    vp_floats = i64(1) if v_in_place else _mul(N, DP, i64(NR))
    body.append(kir.Region((kir.Alloc(kp, _mul(K, NP, i64(NR))), kir.Alloc(vp, vp_floats),
                            kir.Alloc(sb, _mul(i64(rb), N)), kir.Array(scale, rb), batch,
                            kir.Free(kp), kir.Free(vp), kir.Free(sb)), if_=flops))
    kernel = kir.Kernel(ctx.name, ext, (o0,), (qb, kb, vb, *ops.buffers), tuple(body), ctx.symbols)
    return Lowered(kernel, at.outputs, (q_name, kt_name, v_name, *ops.ptrs),
                   needs=("packed_gemm", "packed_gemm_bf16") if low else ("packed_gemm",),
                   method=bf16.method(ctx.options) + "; decoder steps (<= 4 query rows) float32" if low else "")


register_lowering("attention", "kernel", lower_attention)
