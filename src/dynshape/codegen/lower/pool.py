"""A `Pool` item (channels last) as one kernel, vectorised over the contiguous channels.

Windowed pools (MaxPool, AveragePool): per output row, `ds_pool_row` (csrc/ds_pool.c): per output pixel the
taps that fall inside the input, reduced in registers for up to 64 channels at a time; AveragePool divides by
the taps inside the input, or with count_include_pad by those inside the padded input (never ceil_mode's
overhang), as the spec and the reference do. Global pools (and
ReduceMean / ReduceMax over every spatial axis) reduce each image's pixels, OpenMP over images and blocks of
channels so a batch-1 call still uses every thread. A NaN is kept by MaxPool, as numpy's reference keeps it.
"""

from __future__ import annotations

from dynshape.codegen import kir
from dynshape.codegen.clib import I64 as C_I64
from dynshape.codegen.clib import P, declare
from dynshape.codegen.cshared import POOL_GEO, PoolMode
from dynshape.codegen.kir import i64
from dynshape.codegen.library import register_helper
from dynshape.codegen.lower.operands import computable
from dynshape.codegen.lowering import LowerCtx, Lowered, Unsupported, register_lowering
from dynshape.ir import opdef
from dynshape.ir.opdef import PoolKind
from dynshape.ops.conv import window_out, window_params
from dynshape.passes.items import Pool
from dynshape.passes.rules import spatial_reduction

I64, F32 = kir.I64, kir.F32
CBLOCK = 64  # channels per parallel task of a global pool


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
        op = opdef.lookup(node.attrs["op"])
        if op is None or op.pool is None:
            raise Unsupported(f"{node.attrs['op']} is not a pool")
        kind, whole = op.pool, op.global_pool
    else:  # a ReduceMean / ReduceMax over the map
        reduced = spatial_reduction(node, g)
        if reduced is None:
            raise Unsupported(f"{node.label()} is not a reduction over the map")
        kind, whole = reduced, True
    _check_kind(kind)
    if len(x.shape) not in (3, 4):
        raise Unsupported("the pool is not 1-D or 2-D")
    if whole:
        return _global(p, ctx, kind)
    if not isinstance(x.shape[-1], int):
        raise Unsupported("channels must be static for a windowed pool")
    return _windowed(p, ctx, kind)


def _check_kind(kind: PoolKind) -> None:
    """Every pool kind named: a kind the kernel has no case for is refused here, never computed as another."""
    match kind:
        case PoolKind.MAX | PoolKind.AVERAGE:
            return
        case PoolKind.LP:
            raise Unsupported("the pool kernel computes max and average pools, not Lp")
        case _:
            raise RuntimeError(f"pool kind {kind!r} has no case in codegen/lower/pool.py")


def _global(p: Pool, ctx: LowerCtx, kind: PoolKind) -> Lowered:
    x_t = ctx.graph.types[p.node.inputs[0]]
    c = x_t.shape[-1]
    pixels = 1
    for d in x_t.shape[1:-1]:
        pixels = pixels * d
    # channels may be symbolic: a layer norm's mean over 120 features of an (N, L, 120) sequence, which the layout
    # pass reads as (N, 120, L) channels-last (ppocr_rec), reduces 120 "pixels" of L channels
    ext = (x_t.shape[0], pixels) if isinstance(c, int) else (x_t.shape[0], pixels, c)
    N, HW = kir.Extent(0), kir.Extent(1)
    c = c if isinstance(c, int) else kir.Extent(2)
    o0, x = kir.Buffer("o0", F32, const=False), kir.Buffer("i0")
    # a mean sums in double: a float32 running sum over a large map drifts (2**19 * 6 equal values: 1.9% low)
    mean = kind is PoolKind.AVERAGE
    acc = kir.Buffer("acc", kir.F64 if mean else F32, const=False)
    task, n, c0, c1, hw, ch, ch2, ch3 = (kir.Var(v) for v in ("task", "n", "c0", "c1", "hw", "c", "c", "c"))
    blocks = (c + CBLOCK - 1) // CBLOCK if isinstance(c, int) else (c + (CBLOCK - 1)) / CBLOCK  # C's / : c >= 0
    start = kir.Const(0.0, kir.F64) if mean else _f(float("-inf"))
    value = kir.Load(x, (n * HW + hw) * c + ch2)
    reduce = kir.Load(acc, ch2 - c0) + kir.Cast(value, kir.F64) if mean else _max(kir.Load(acc, ch2 - c0), value)
    simd = kir.Omp(simd=True, schedule=None)
    out = kir.Cast(kir.Load(acc, ch3 - c0) / kir.Cast(HW, kir.F64), F32) if mean else kir.Load(acc, ch3 - c0)
    body = (kir.Let(n, task / blocks), kir.Let(c0, (task % blocks) * CBLOCK),
            kir.Let(c1, kir.Select(c0 + CBLOCK < c, c0 + CBLOCK, i64(c))),
            kir.For(ch, c1, (kir.Store(acc, ch - c0, start),), start=c0, omp=simd),
            kir.For(hw, HW, (kir.For(ch2, c1, (kir.Store(acc, ch2 - c0, reduce),), start=c0, omp=simd),)),
            kir.For(ch3, c1, (kir.Store(o0, n * c + ch3, out),), start=c0, omp=simd))
    work = N * HW * c
    region = kir.Region((kir.Alloc(acc, i64(CBLOCK)), kir.For(task, N * blocks, body, omp=kir.Omp(shared=True)),
                         kir.Free(acc)), if_=work >= ctx.options.par_min_elements)
    kernel = kir.Kernel(ctx.name, ext, (o0,), (x,), (region,), ctx.symbols)
    return Lowered(kernel, p.outputs, (p.node.inputs[0],))


def _windowed(p: Pool, ctx: LowerCtx, kind: PoolKind) -> Lowered:
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
    o0, x = kir.Buffer("o0", F32, const=False), kir.Buffer("i0")
    geo = kir.Buffer("geo", I64, const=False)
    mode = PoolMode.MAX if kind is PoolKind.MAX else PoolMode.AVG_PADS if a.get("count_include_pad", 0) \
        else PoolMode.AVG
    fields = {"H": E["H"], "W": E["W"], "C": i64(c), "OH": E["OH"], "OW": E["OW"], "KH": i64(kernel[0]),
              "KW": i64(kernel[1]), "SH": i64(strides[0]), "SW": i64(strides[1]), "DH": i64(dilations[0]),
              "DW": i64(dilations[1]), "PT": E["PT"], "PL": E["PL"], "PB": E["PB"], "PR": E["PR"], "MODE": i64(mode)}
    body: list[kir.Stmt] = [kir.Array(geo, len(POOL_GEO))]  # ds_shared.h's DS_POOL_* indices
    body += [kir.Store(geo, i64(i), fields[k]) for i, k in enumerate(POOL_GEO)]
    nho, n, ho = kir.Var("nho"), kir.Var("n"), kir.Var("ho")
    row = (kir.Let(n, nho / E["OH"]), kir.Let(ho, nho % E["OH"]),
           kir.Eval(kir.Call("ds_pool_row", (kir.Addr(geo), kir.Addr(x), kir.Addr(o0, nho * E["OW"] * c), n, ho),
                             "void")))
    work = kir.product([E["N"], E["OH"], E["OW"], i64(c * kernel[0] * kernel[1])])
    body.append(kir.For(nho, E["N"] * E["OH"], row,
                        omp=kir.Omp(parallel=True, if_=work >= ctx.options.par_min_elements)))
    kern = kir.Kernel(ctx.name, ext, (o0,), (x,), tuple(body), ctx.symbols)
    return Lowered(kern, p.outputs, (node.inputs[0],), needs=("pool",))


LIBRARY = declare("pool", "ds_pool.c", {"ds_pool_row": (P, P, P, C_I64, C_I64)}, share=True)
register_helper("pool", LIBRARY, "ds_pool.h")
register_lowering("pool", "kernel", lower_pool)
