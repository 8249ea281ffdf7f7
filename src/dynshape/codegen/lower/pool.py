"""A `Pool` item (channels last) as one loop nest, vectorised over the contiguous channels.

Windowed pools (MaxPool, AveragePool): per output pixel, the taps that fall inside the input are reduced into
a row of C floats (in L1); AveragePool divides by the taps inside the input, or with count_include_pad by those
inside the padded input (never ceil_mode's overhang), as the spec and the reference do. Global pools (and
ReduceMean / ReduceMax over every spatial axis) reduce each image's pixels, OpenMP over images and blocks of
channels so a batch-1 call still uses every thread. A NaN is kept by MaxPool, as numpy's reference keeps it.
"""

from __future__ import annotations

from dynshape.codegen import kir
from dynshape.codegen.lower.operands import computable
from dynshape.codegen.lowering import LowerCtx, Lowered, Unsupported, register_lowering
from dynshape.ops.conv import window_out, window_params
from dynshape.passes.items import Pool
from dynshape.passes.rules import spatial_reduction

I64, F32 = kir.I64, kir.F32
CBLOCK = 64  # channels per parallel task of a global pool


def _i(x: int) -> kir.Const:
    return kir.Const(x, I64)


def _f(x: float) -> kir.Const:
    return kir.Const(x, F32)


def _max(acc: kir.Expr, v: kir.Expr) -> kir.Expr:
    """acc when acc is NaN or the larger (numpy's argmax picks the first NaN)."""
    return kir.Select(kir.Bin("||", kir.Bin("!=", acc, acc), kir.Bin(">=", acc, v)), acc, v)


def lower_pool(p: Pool, ctx: LowerCtx) -> Lowered:
    g, node = ctx.graph, p.node
    x = g.types[node.inputs[0]]
    computable(tuple(x.shape), ctx.key_names)
    computable(tuple(p.shape), ctx.key_names)
    if node.op_type == "ChannelsLast":
        op = node.attrs["op"]
        kind = {"GlobalAveragePool": "mean", "GlobalMaxPool": "max"}.get(op)
    else:
        op, kind = node.op_type, spatial_reduction(node, g)
    if not isinstance(x.shape[-1], int) or len(x.shape) not in (3, 4):
        raise Unsupported("channels must be static, the pool 1-D or 2-D")
    if kind is not None:
        return _global(p, ctx, kind)
    return _windowed(p, ctx, op)


def _global(p: Pool, ctx: LowerCtx, kind: str) -> Lowered:
    x_t = ctx.graph.types[p.node.inputs[0]]
    c = x_t.shape[-1]
    pixels = 1
    for d in x_t.shape[1:-1]:
        pixels = pixels * d
    ext = (x_t.shape[0], pixels)
    N, HW = kir.Extent(0), kir.Extent(1)
    o0, x = kir.Buffer("o0", F32, const=False), kir.Buffer("i0")
    # a mean sums in double: a float32 running sum over a large map drifts (2**19 * 6 equal values: 1.9% low)
    mean = kind == "mean"
    acc = kir.Buffer("acc", kir.F64 if mean else F32, const=False)
    task, n, c0, c1, hw, ch, ch2, ch3 = (kir.Var(v) for v in ("task", "n", "c0", "c1", "hw", "c", "c", "c"))
    blocks = (c + CBLOCK - 1) // CBLOCK
    start = kir.Const(0.0, kir.F64) if mean else _f(float("-inf"))
    value = kir.Load(x, (n * HW + hw) * c + ch2)
    reduce = kir.Load(acc, ch2 - c0) + kir.Cast(value, kir.F64) if mean else _max(kir.Load(acc, ch2 - c0), value)
    simd = kir.Omp(simd=True, schedule=None)
    out = kir.Cast(kir.Load(acc, ch3 - c0) / kir.Cast(HW, kir.F64), F32) if mean else kir.Load(acc, ch3 - c0)
    body = (kir.Let(n, task / blocks), kir.Let(c0, (task % blocks) * CBLOCK),
            kir.Let(c1, kir.Select(c0 + CBLOCK < c, c0 + CBLOCK, _i(c))),
            kir.For(ch, c1, (kir.Store(acc, ch - c0, start),), start=c0, omp=simd),
            kir.For(hw, HW, (kir.For(ch2, c1, (kir.Store(acc, ch2 - c0, reduce),), start=c0, omp=simd),)),
            kir.For(ch3, c1, (kir.Store(o0, n * c + ch3, out),), start=c0, omp=simd))
    work = N * HW * c
    region = kir.Region((kir.Alloc(acc, _i(CBLOCK)), kir.For(task, N * blocks, body, omp=kir.Omp(shared=True)),
                         kir.Free(acc)), if_=work >= ctx.options.par_min_elements)
    kernel = kir.Kernel(ctx.name, ext, (o0,), (x,), (region,), ctx.symbols)
    return Lowered(kernel, p.outputs, (p.node.inputs[0],))


def _windowed(p: Pool, ctx: LowerCtx, op: str) -> Lowered:
    node = p.node
    a = node.attrs
    x_t = ctx.graph.types[node.inputs[0]]
    nd = len(x_t.shape) - 2
    kernel = [int(k) for k in a["kernel_shape"]]
    strides, dilations, pbs, pes, auto_pad = window_params(a.get, nd)
    ceil_mode = bool(a.get("ceil_mode", 0))
    spatial = list(x_t.shape[1:1 + nd])
    begins = [window_out(h, k, s, d, pb, pe, auto_pad, ceil_mode)[1]
              for h, k, s, d, pb, pe in zip(spatial, kernel, strides, dilations, pbs, pes)]
    out = list(p.shape[1:1 + nd])
    ends = list(pes) if auto_pad == "NOTSET" else [0] * nd
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):  # the end pads SAME adds (what count_include_pad counts)
        ends = [(o - 1) * s + d * (k - 1) + 1 - h - b for h, o, s, d, k, b in
                zip(spatial, out, strides, dilations, kernel, begins)]
    elif auto_pad == "VALID":
        begins = [0] * nd
    if nd == 1:
        spatial, out, kernel, strides, dilations, begins, ends = (
            [1, *v] for v in (spatial, out, kernel, strides, dilations, begins, ends))
        strides[0] = dilations[0] = 1
        begins[0] = ends[0] = 0
    c = x_t.shape[-1]
    names = ("N", "H", "W", "OH", "OW", "PT", "PL", "PB", "PR")
    ext = (x_t.shape[0], spatial[0], spatial[1], out[0], out[1], begins[0], begins[1], ends[0], ends[1])
    E = {k: kir.Extent(i) for i, k in enumerate(names)}
    H, W, oh, ow = E["H"], E["W"], E["OH"], E["OW"]
    o0, x = kir.Buffer("o0", F32, const=False), kir.Buffer("i0")
    acc = kir.Buffer("acc", F32, const=False)
    nho, n, ho, wo, r, kh, kw, ih, iw, base = (kir.Var(v) for v in ("nho", "n", "ho", "wo", "r", "kh", "kw", "ih",
                                                                    "iw", "base"))
    ch, ch_init, ch_out = kir.Var("c"), kir.Var("c"), kir.Var("c")
    count, padded = kir.Var("count"), kir.Var("padded")
    simd = kir.Omp(simd=True, schedule=None)
    is_max = op == "MaxPool"
    v = kir.Load(x, base + ch)
    reduce = _max(kir.Load(acc, ch), v) if is_max else kir.Load(acc, ch) + v
    tap = [kir.Let(base, ((n * H + ih) * W + iw) * c), kir.For(ch, _i(c), (kir.Store(acc, ch, reduce),), omp=simd)]
    if not is_max:
        tap.append(kir.Assign(count, count + 1))
    inside_w, inside_h = kir.Bin("&&", iw >= 0, iw < W), kir.Bin("&&", ih >= 0, ih < H)
    include_pad = not is_max and bool(a.get("count_include_pad", 0))
    iw_at = kir.Let(iw, wo * strides[1] - E["PL"] + kw * dilations[1])
    ih_at = kir.Let(ih, ho * strides[0] - E["PT"] + kh * dilations[0])
    if include_pad:  # the divisor counts taps inside the padded input (explicit or SAME pads), not the overhang
        in_pads = kir.Bin("&&", kir.Bin("&&", ih + E["PT"] >= 0, ih < H + E["PB"]),
                          kir.Bin("&&", iw + E["PL"] >= 0, iw < W + E["PR"]))
        per_kw = kir.For(kw, _i(kernel[1]), (iw_at, kir.If(kir.Bin("&&", inside_h, inside_w), tuple(tap)),
                                             kir.If(in_pads, (kir.Assign(padded, padded + 1),))))
        per_kh = kir.For(kh, _i(kernel[0]), (ih_at, per_kw))
    else:
        per_kw = kir.For(kw, _i(kernel[1]), (iw_at, kir.If(inside_w, tuple(tap))))
        per_kh = kir.For(kh, _i(kernel[0]), (ih_at, kir.If(inside_h, (per_kw,))))
    start = _f(float("-inf")) if is_max else _f(0.0)
    divisor = padded if include_pad else count
    result = kir.Load(acc, ch_out) if is_max else kir.Load(acc, ch_out) / kir.Cast(divisor, F32)
    pixel = [kir.Let(r, nho * ow + wo), kir.For(ch_init, _i(c), (kir.Store(acc, ch_init, start),), omp=simd)]
    if not is_max:
        pixel.append(kir.Decl(count, _i(0)))
    if include_pad:
        pixel.append(kir.Decl(padded, _i(0)))
    pixel += [per_kh, kir.For(ch_out, _i(c), (kir.Store(o0, r * c + ch_out, result),), omp=simd)]
    rows = kir.For(nho, E["N"] * oh, (kir.Let(n, nho / oh), kir.Let(ho, nho % oh), kir.For(wo, ow, tuple(pixel))),
                   omp=kir.Omp(shared=True))
    work = kir.product([E["N"], oh, ow, _i(c * kernel[0] * kernel[1])])
    region = kir.Region((kir.Alloc(acc, _i(c)), rows, kir.Free(acc)), if_=work >= ctx.options.par_min_elements)
    kern = kir.Kernel(ctx.name, ext, (o0,), (x,), (region,), ctx.symbols)
    return Lowered(kern, p.outputs, (node.inputs[0],))


register_lowering("pool", "kernel", lower_pool)
