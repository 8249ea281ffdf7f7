"""ConvTranspose whose kernel equals its stride (an FPN's or a UNet's 2x2 / stride-2 upsampling), as a product of
blocks of input pixels by every tap's weights at once, each block's result then placed (codegen/lower/conv.py
hands these to it); in bf16 on bf16 pairs where the precision asks and the product is wide enough."""

from __future__ import annotations

from dynshape.codegen import bf16, cshared, kir
from dynshape.codegen.kir import i64
from dynshape.codegen.lower.product import epilogue_loop
from dynshape.codegen.lowering import LowerCtx, Lowered, PackedWeight, Unsupported
from dynshape.codegen.packed_gemm import NR
from dynshape.passes.items import Conv
from dynshape.passes.values import const_value
from dynshape.sym import eq, prove

I64 = kir.I64
ROWS = cshared.CONV_ROWS  # input pixels per block
_call = kir.call_void


def lower_deconv(cv: Conv, ctx: LowerCtx, ops) -> Lowered:
    """ConvTranspose whose kernel equals its stride (no overlap: each input pixel writes its own KH x KW block, the
    FPN heads' 2x2 / stride-2 upsampling): blocks of an input row's pixels times the (Ci, KH*KW*Co) matrix of
    every tap at once (so even one output channel fills the panels), into a scratch tile in cache, then each
    value to its place in the output, through the epilogue."""
    g, node = ctx.graph, cv.node
    w = const_value(node.inputs[1], g)
    x_t, y_t = g.types[node.inputs[0]], g.types[node.outputs[0]]
    nd = len(x_t.shape) - 2
    a = node.attrs
    kernel = list(w.shape[2:])
    strides = list(a.get("strides", [1] * nd))
    if nd != 2 or kernel != strides or int(a.get("group", 1)) != 1 or any(a.get("pads", [0] * 4)) \
            or any(a.get("output_padding", [0] * 2)) or any(d != 1 for d in a.get("dilations", [1, 1])) \
            or a.get("output_shape") is not None or a.get("auto_pad", "NOTSET") != "NOTSET":
        raise Unsupported("a ConvTranspose whose kernel is not its stride (overlapping taps), or grouped / padded")
    for o, i, k in zip(y_t.shape[1:3], x_t.shape[1:3], kernel):
        if prove(eq(o, i * k)) is not True:  # H == 32 * (H // 32) when 32 | H: proved, not compared as text
            raise Unsupported(f"output {y_t.shape} is not the input times the stride")
    kh_, kw_ = kernel
    ci, co = int(w.shape[0]), int(w.shape[1])
    tc = kh_ * kw_ * co  # the product's columns: every tap's output channels
    ext = (x_t.shape[0], x_t.shape[1], x_t.shape[2])
    N, H, W = (kir.Extent(i) for i in range(3))
    OW = W * kw_
    o0 = kir.Buffer("o0", kir.F32, const=False)
    x, bp = kir.Buffer("i0"), kir.Buffer("i1")
    sb = kir.Buffer("sb", kir.F32, const=False)
    panels = (tc + NR - 1) // NR
    nh, wb, w0, m, q, i, t, r, j, c = (kir.Var(v) for v in ("nh", "wb", "w0", "m", "q", "i", "t", "r", "j", "c"))
    n, h = kir.Var("n"), kir.Var("h")
    rows = (W + (ROWS - 1)) / ROWS
    # bf16: the block's rows rounded once (the epoch's memo) for all panels, products on bf16 pairs; a deconv
    # of few multiply-adds an output pixel (Ci x Co, bf16_min_conv_macs) stays float32 as a narrow conv does
    low = bf16.active(ctx.options) and ci * co >= ctx.options.bf16_min_conv_macs
    ep = kir.Var("ep")
    # per kernel row kh, the block's pixels fill one contiguous run of m * KW * Co output floats: copied pixel by
    # pixel (KW * Co contiguous floats each), then the epilogue along the run: one loop over all of it for one
    # channel (a detector's sigmoid head ran its epilogue one scalar value at a time: 0.95 -> 0.68 ms for 480x640
    # outputs), else pixel by pixel over the channels (a channel index j % Co kept the loop from vectorising)
    run = kw_ * co
    place = [kir.Let(r, ((n * H + h) * kh_ + t) * OW + w0 * kw_),
             kir.For(i, m, (kir.For(c, i64(run), (kir.Store(o0, (r + i * kw_) * co + c,
                                                           kir.Load(sb, i * tc + t * run + c)),),
                                    omp=kir.Omp(simd=True, schedule=None)),))]
    if co == 1:
        place += epilogue_loop(g, ops, node, cv.epilogue, cv.outputs[0], o0, r + j, r, j, (i64(0), m * kw_), 1,
                               channel=i64(0))
    else:
        px = kir.Var("px")
        per_pixel = epilogue_loop(g, ops, node, cv.epilogue, cv.outputs[0], o0, px * co + j, px, j, (i64(0), i64(co)),
                                  co)
        if per_pixel:
            place.append(kir.For(px, r + m * kw_, tuple(per_pixel), start=r))
    block = [kir.Let(n, nh / H), kir.Let(h, nh % H), kir.Let(w0, wb * ROWS),
             kir.Let(m, kir.Select(w0 + ROWS < W, i64(ROWS), W - w0)),
             kir.For(q, i64(panels), (_deconv_panel(ctx, kir.Addr(x, (nh * W + w0) * ci), ci, bp, sb, tc, m, q, ep)
                                     if low else _call("ds_gemm_tile", kir.Addr(x, (nh * W + w0) * ci), i64(ci),
                                                       kir.Addr(bp), kir.Addr(sb), i64(tc), i64(0), m, q, i64(tc),
                                                       i64(ci)),)),
             kir.For(t, i64(kh_), tuple(place))]
    flops = kir.product([N, H, W, i64(ci * tc)])
    loop = kir.For(nh, N * H, (kir.For(wb, rows, tuple(block)),), omp=kir.Omp(shared=True, collapse=2))
    body = (*((kir.Let(ep, kir.Call("ds_bf16_epoch", (), I64)),) if low else ()),
            kir.Region((kir.Alloc(sb, i64(ROWS * tc)), loop, kir.Free(sb)), if_=flops >= ctx.options.par_min_flops))
    kernel_ir = kir.Kernel(ctx.name, ext, (o0,), (x, bp, *ops.buffers), body, ctx.symbols)
    layout = {"bf16": "deconv_bf16", "bf16-emulated": "deconv_bf16e"}.get(ctx.options.precision) if low else "deconv"
    how = "ConvTranspose: blocks of input pixels times every tap's weights"
    return Lowered(kernel_ir, cv.outputs, (node.inputs[0], PackedWeight(cv.weight, layout=layout), *ops.ptrs),
                   method=f"{how}; {bf16.method(ctx.options)}" if low else how,
                   needs=("packed_gemm", "packed_gemm_bf16") if low else ("packed_gemm",))


def _deconv_panel(ctx: LowerCtx, a: kir.Expr, ci: int, bp: kir.Buffer, sb: kir.Buffer, tc: int, m: kir.Expr,
                  q: kir.Expr, ep: kir.Expr) -> kir.Stmt:
    """Rows 0..m of the block `a` (ci values a row) times panel q of the bf16 deconv weights (pairs_of
    pack_deconv: ceil(ci / 2) rows of 64 bf16 a panel; bf16-emulated: ci rows of 32 rounded floats), into
    columns q * 32.. of the scratch tile sb (tc columns a row)."""
    _, panel_fn = bf16.product_calls(ctx.options)
    floats = (ci + 1) // 2 * 32 if ctx.options.precision == "bf16" else ci * 32  # a panel, in floats
    ncols = kir.Select((q + 1) * NR <= tc, i64(NR), tc - q * NR)
    return _call(panel_fn, a, i64(ci), kir.Addr(bp, q * floats), kir.Addr(sb, q * NR), i64(tc), i64(0), m, ncols,
                 i64(ci), ep)
