"""A `Conv` item (channels last) as one kernel, its epilogue applied to each tile while it is in cache.

Two strategies, chosen by the weights' shape:
- depthwise (one input and one output channel per group): per output row, `ds_dwconv_row` (csrc/ds_conv_dw_wino.c)
  vectorised over the contiguous channels, eight interior pixels in registers at once, then the epilogue over
  the row while it is in L1 (under 16 channels, a loop nest per pixel, vectorised by GCC at the exact width);
- every other convolution (dense, grouped, strided, dilated, padded, 1-D or 2-D): implicit GEMM on packed
  weights (`ds_conv_tile2`, csrc/ds_conv.c), OpenMP over (block of output pixels, group, pair of 32-channel
  panels) tiles.
Runtime dims (batch, H, W, and the pads SAME_* derives from them) are computed from the key; static ones
(channels, kernel sizes, strides) are literals.
"""

from __future__ import annotations

from dataclasses import replace

from dynshape.codegen import bf16, cshared, kir
from dynshape.codegen.clib import I64 as C_I64
from dynshape.codegen.clib import P, declare
from dynshape.codegen.kir import i64
from dynshape.codegen.library import register_helper
from dynshape.codegen.lower import conv_amx, conv_storage
from dynshape.codegen.lower.conv_geometry import columns_for_rows, geometry
from dynshape.codegen.lower.conv_precision import bf16_too_narrow, bf16_winograd_too_narrow
from dynshape.codegen.lower.deconv import lower_deconv
from dynshape.codegen.lower.operands import computable, operands
from dynshape.codegen.lower.product import AMX_TILING, epilogue_loop
from dynshape.codegen.lowering import ROW_STRIDE, LowerCtx, Lowered, PackedWeight, Unsupported, register_lowering
from dynshape.codegen.packed_gemm import NR
from dynshape.ir.opdef import is_default_domain
from dynshape.passes.items import Conv, ConvChain
from dynshape.passes.rules import FINISHING_ACTS, finishing_act, prologue_of
from dynshape.passes.values import row_pattern
from dynshape.sym import sym

I64 = kir.I64
ROWS = cshared.CONV_ROWS  # output pixels per tile
MICRO_ROWS = 12  # the widest micro-tile's pixels: the fewest a block is made smaller to
BLOCK_ALIGN = 6  # blocks start at multiples of the two-panel micro-tile's pixels (ds_conv_tile2's 6 x 64)
MIN_TILES_PER_THREAD = 4
BLOCK_MAJOR_BYTES = 256 << 10  # packed weights up to this size: tiles in block-major order (see _implicit_gemm)
AMX_BLOCK_MAJOR_BYTES = 2 << 20  # the same for bf16 weights on AMX tiles


_call = kir.call_void


def lower_conv(cv: Conv, ctx: LowerCtx) -> Lowered:
    g = ctx.graph
    shape = tuple(cv.shape)
    computable(shape, ctx.key_names)
    computable(tuple(g.types[cv.node.inputs[0]].shape), ctx.key_names)
    if not isinstance(shape[-1], int) or not isinstance(g.types[cv.node.inputs[0]].shape[-1], int):
        raise Unsupported("channels must be static")
    pro = _prologue_steps(cv, ctx)
    ops = operands([z for z in cv.inputs[1:] if z not in _scale_shift(pro)], shape, g, first_param=2)
    if not all(row_pattern(p) for p in ops.patterns):
        raise Unsupported("an epilogue operand is neither a full tensor, a per-channel vector nor one value")
    if cv.node.attrs["op"] == "ConvTranspose":
        return lower_deconv(cv, ctx, ops)
    geo = columns_for_rows(geometry(cv, ctx))
    if not all(isinstance(geo[k], int) for k in ("C", "OC", "KH", "KW", "G")):
        raise Unsupported("channels, kernel size and groups must be static")
    names = ("N", "H", "W", "OH", "OW", "PT", "PL")
    ext = [geo[k] for k in names]
    E = {k: kir.Extent(i) for i, k in enumerate(names)}
    depthwise = geo["CG"] == 1 and geo["OCG"] == 1
    fp32 = replace(ctx, options=ctx.options.replace(precision="fp32"))  # (explain then says float32)
    narrow_only = bf16.active(ctx.options) and not depthwise and bf16_too_narrow(geo, ctx.options.bf16_min_conv_macs)
    if narrow_only and not conv_amx.narrow_fits(geo, ctx.options):  # (the narrow tiles gather nothing: 1.1-3.5x
        ctx = fp32  # float32)
    if pro is not None:  # a 1x1 conv in bf16 (rules.match_conv_prologue): the implicit GEMM's tiles apply it
        return _implicit_gemm(cv, ctx, geo, ops, ext, E, pro)
    # fewer than 16 channels: the loop nest, which GCC vectorises at the exact width, beats a half-masked vector
    # (but 1, 2, 4 or 8 channels at stride 1 run in C as flat runs of pixels: flat_depthwise)
    # on AMX tiles the products are ~4x VDPBF16PS's rate, and Winograd's input and output transforms (float32 vector
    # work) cost more than the multiplies they save: a 3x3 conv is an implicit GEMM there (probe: resnet18, unet)
    if not depthwise and ctx.options.winograd and winograd_fits(geo, ctx.options) and not bf16.amx_tiles(ctx.options):
        # bf16 products: F(2x2) only (F(4x4)'s transforms amplify bf16's rounding: errors of 0.4 of the output's
        # RMS on a 40x40 map, against 0.02 for F(2x2) and 0.015 for the direct sum in bf16); a narrow conv takes
        # float32's F(4x4) where its map pays for it and F(2x2) in bf16 elsewhere (bf16_winograd_too_narrow)
        low = bf16.active(ctx.options)
        tile = 2 if low and not bf16_winograd_too_narrow(geo, ctx.options.bf16_min_winograd_macs) \
            else ctx.options.winograd_tile
        direct = direct_beside(geo, ctx.options.winograd_min_tiles)
        if direct is not None:
            return _winograd(cv, ctx, geo, ops, ext, E, winograd_tiles(geo, tile), direct)
    lower = (_depthwise if geo["C"] >= 16 or flat_depthwise(geo) else _depthwise_loops) if depthwise \
        else _implicit_gemm
    try:
        return lower(cv, ctx, geo, ops, ext, E)
    except _GatheredInstead:  # an epilogue the narrow tiles do not finish: their gathered fallback would be slower
        return lower(cv, fp32, geo, ops, ext, E)  # than float32, as bf16_too_narrow measured


class _GatheredInstead(Exception):
    """A conv under bf16_too_narrow that bf16 took for the narrow tiles cannot have them (its epilogue needs a loop
    after the tiles): it is lowered in float32 instead of on the gathered bf16 tiles."""


def flat_depthwise(geo: dict) -> bool:
    """A depthwise conv of 1, 2, 4 or 8 channels and stride 1 runs in C too (csrc/ds_conv_dw_wino.c's ds_dw_flat:
    a row's interior as one flat run of floats, 16 / C pixels a vector; the C also checks KH * KW <= 64 and falls
    back to its per-pixel blocks)."""
    return geo["C"] in (1, 2, 4, 8) and geo["SW"] == 1


def wino_pays(n, oh, ow, min_tiles: int, div=lambda a, b: a // b):
    """Whether Winograd beats the implicit GEMM on a call's map: at least `min_tiles` F(2x2) tiles (all images).
    Fewer tiles save few multiply-adds (a 3x3 map's 4 tiles compute 64 products a channel pair, the direct sum
    81) while the transformed weights are 16/9 of the packed ones (36/9 for F(4x4)), streamed from memory
    whenever the model's weights outgrow the cache. Measured on chains of distinct convs (weights streamed),
    1 thread, per conv, F(2x2) / implicit GEMM: 512 channels 3x3 1.66 / 0.72 ms, 6x6 1.55 / 1.33, 7x7 1.93 /
    1.84, 8x8 1.95 / 2.27, 12x12 2.72 / 4.63; 256 channels 3x3 0.43 / 0.14, 6x6 0.41 / 0.35, 7x7 0.52 / 0.45,
    8x8 0.52 / 0.56; 64 and 128 channels alike (2 threads: the same crossing). 16 tiles: a 7x7 or 8x8 map.
    `div` as wino4_pays': ints for a static map, kir expressions for the call's."""
    return n * (div(oh + 1, 2) * div(ow + 1, 2)) >= min_tiles


def direct_beside(geo: dict, min_tiles: int) -> bool | None:
    """Where a Winograd-shaped conv runs: None, implicit GEMM only (a static map too small for Winograd, by
    `wino_pays`); False, Winograd only (a static map large enough, or the option's 0); True: both packed in one
    kernel, each call choosing by `wino_pays` on its map (a runtime map)."""
    if min_tiles <= 0:
        return False
    n, oh, ow = geo["N"], geo["OH"], geo["OW"]
    if all(isinstance(d, int) for d in (n, oh, ow)):
        return False if wino_pays(n, oh, ow, min_tiles) else None
    return True


def winograd_min_channels(options) -> int:
    """Input channels from which Winograd pays (the option; None: 32 without AVX-512, whose transforms cost more)."""
    given = options.winograd_min_channels
    return given if given is not None else 16 if "avx512f" in bf16.cpu_flags() else 32


def winograd_fits(geo: dict, options=None) -> bool:
    """Winograd takes a 3x3 convolution of stride 1, undilated and ungrouped, with at least 16 input and output
    channels (the transforms run 16 or 8 channels at a time, a tail partial; with fewer, the products are too short
    to pay for them: the RGB stem stays on the runs path), and as many as `winograd_min_channels(options)`."""
    return (geo["KH"], geo["KW"], geo["SH"], geo["SW"], geo["DH"], geo["DW"], geo["G"]) == (3, 3, 1, 1, 1, 1, 1) \
        and geo["C"] >= max(16, winograd_min_channels(options) if options else 16) and geo["OC"] >= 16


ACT_NONE, ACT_RELU, ACT_HARDSWISH, ACT_SILU, ACT_RELU6 = (
    cshared.Act.NONE, cshared.Act.RELU, cshared.Act.HARDSWISH, cshared.Act.SILU, cshared.Act.RELU6)  # DS_ACT_*
# an epilogue that is just one of these: applied in the C (the order of passes/rules.py's FINISHING_ACTS, which the
# 1x1 -> depthwise rule checks)
_ACTS = dict(zip(FINISHING_ACTS, (ACT_RELU, ACT_HARDSWISH, ACT_SILU, ACT_RELU6), strict=True))


def _geo_array(geo: dict, E: dict, act: int = ACT_NONE, npix: kir.Expr | None = None, name: str = "geo"
               ) -> tuple[kir.Buffer, list[kir.Stmt]]:
    """The geometry array the conv libraries read (cshared.CONV_GEO's fields, ds_shared.h's DS_CONV_* indices),
    filled from the key."""
    geo_buf = kir.Buffer(name, I64, const=False)
    fields = {
        # LDY, the distance between output pixels: the key's row-stride slot where the kernel has one (its pixel,
        # or a Concat's wider one), else the pixel itself
        "LDY": E.get("LD", i64(geo["OC"])),
        "ACT": i64(act),
        # NPIX, the output pixels of the call: a pair's last block (p1 == NPIX) prefetches the next pair's weights
        "NPIX": kir.product([E["N"], E["OH"], E["OW"]]) if npix is None else npix,
        "WREST": i64(0),  # the conv's own packed weights
        "XBF": i64(0), "YBF": i64(0), "RBF": i64(0)}  # float32 input, output, residual (conv_storage.flag_stores)
    body: list[kir.Stmt] = [kir.Array(geo_buf, len(cshared.CONV_GEO))]
    for i, k in enumerate(cshared.CONV_GEO):
        body.append(kir.Store(geo_buf, i64(i), fields[k] if k in fields else E[k] if k in E else i64(geo[k])))
    return geo_buf, body


def _bias_operand(node, ops) -> tuple[str | None, bool]:
    """The conv's bias input (None without one) and whether it is a per-output-channel vector among the kernel's
    operands: what the conv's C can add itself."""
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    pat = ops.patterns[ops.ptrs.index(bias)] if bias is not None and bias in ops.ptrs else ()
    return bias, bool(pat) and bool(pat[-1]) and not any(pat[:-1])


def _finish_in_tiles(cv: Conv, ctx: LowerCtx, ops, residual: bool = False) -> tuple[str | None, int, str | None]:
    """What the conv's C applies in registers before storing (csrc/ds_conv.c's DS_FIN_ROWS), so that the generated
    epilogue need not: (the bias operand when it is a per-output-channel vector, the ACT_* of an epilogue that is
    exactly one of FINISHING_ACTS of the conv's output (rules.finishing_act), or with `residual` (the
    implicit-GEMM tiles) exactly Add(conv, R) (or a Sum of the two) or that then Relu, R a float32 map like the
    output: R's operand). (None, ACT_NONE, None) where the option is off or none of these holds."""
    if not ctx.options.conv_bias_in_tiles:
        return None, ACT_NONE, None
    node = cv.node
    bias, per_channel = _bias_operand(node, ops)
    if bias is not None and not per_channel:  # a scalar or computed bias: the epilogue adds it, and what follows
        return None, ACT_NONE, None
    group = list(cv.epilogue.group if cv.epilogue else ())
    if len(cv.outputs) != 1 or not group or any(not is_default_domain(n) for n in group):
        return bias, ACT_NONE, None
    last = group[-1].outputs[0] == cv.outputs[0]
    act = finishing_act(group, node.outputs[0], ctx.graph)
    if act is not None and last:
        return bias, _ACTS[act], None
    add = group[0]
    # (a Sum of two is an Add: Caffe2's ResNet-50, the onnx package's light_resnet50, sums its residuals)
    if not (residual and add.op_type in ("Add", "Sum") and len(add.inputs) == 2 and node.outputs[0] in add.inputs):
        return bias, ACT_NONE, None
    res = add.inputs[1] if add.inputs[0] == node.outputs[0] else add.inputs[0]
    full = res in ops.ptrs and all(ops.patterns[ops.ptrs.index(res)]) and len(ops.patterns[ops.ptrs.index(res)]) > 1
    if not full or res == node.outputs[0] or ops.buffers[ops.ptrs.index(res)].dtype != kir.F32:
        return bias, ACT_NONE, None
    if len(group) == 1 and last:
        return bias, ACT_NONE, res
    if (len(group) == 2 and group[1].outputs[0] == cv.outputs[0] and group[1].op_type == "Relu"
            and list(group[1].inputs) == [add.outputs[0]]):
        return bias, ACT_RELU, res
    return bias, ACT_NONE, None


def _operand_addr(ops, name: str | None) -> kir.Expr:
    """The address of operand `name` of the kernel, NULL for None."""
    return kir.NULL if name is None else kir.Addr(ops.buffers[ops.ptrs.index(name)])


def _without_bias(node):
    """The conv node without its bias input: what the epilogue sees where the C adds the bias itself."""
    return type(node)(node.op_type, node.domain, node.name, node.attrs, node.inputs[:2], node.outputs)


def _prologue_steps(cv: Conv, ctx: LowerCtx) -> dict[str, str] | None:
    """The conv's prologue as rules.prologue_of reads it (None: it has none)."""
    if cv.prologue is None:
        return None
    steps = prologue_of(cv.prologue.group, cv.node.inputs[0], int(ctx.graph.types[cv.inputs[0]].shape[-1]),
                        ctx.graph)
    if steps is None or cv.node.attrs["op"] != "Conv":
        raise Unsupported("a conv prologue that is not a per-channel scale, shift and Relu")
    return steps


def _scale_shift(steps: dict[str, str] | None) -> list[str]:
    """The prologue's scale and shift values, those present."""
    return [steps[k] for k in ("Mul", "Add") if k in steps] if steps else []


def _prologue(steps: dict[str, str], ops) -> tuple[list[kir.Buffer], list[str], tuple[kir.Expr, ...]]:
    """(the prologue's kernel buffers, their values, the tile call's last three arguments: scale, shift (NULL
    where absent), 1 for a Relu)."""
    bufs, names, args = [], [], []
    for k in ("Mul", "Add"):
        if k in steps:
            b = kir.Buffer(f"i{2 + len(ops.buffers) + len(bufs)}")
            bufs.append(b)
            names.append(steps[k])
            args.append(kir.Addr(b))
        else:
            args.append(kir.NULL)
    return bufs, names, (*args, i64(int("Relu" in steps)))


def _implicit_gemm(cv: Conv, ctx: LowerCtx, geo: dict, ops, ext: list, E: dict,
                   steps: dict[str, str] | None = None) -> Lowered:
    """The implicit GEMM's kernel; `steps`: its prologue (_prologue_steps), if any."""
    ext, E = [*ext, sym(ROW_STRIDE)], {**E, "LD": kir.Extent(len(ext))}  # output pixels a key slot apart
    o0 = kir.Buffer("o0", kir.F32, const=False)
    x, bp = kir.Buffer("i0"), kir.Buffer("i1")
    pro_bufs, pro_names, pro_args = _prologue(steps, ops) if steps is not None else ([], [], ())
    if pro_args and not bf16.active(ctx.options):
        raise Unsupported("a conv prologue outside bf16 (rules.match_conv_prologue admits none)")
    bn = kir.Buffer(f"i{2 + len(ops.buffers) + len(pro_bufs)}")  # the narrow or padded weights, where taken
    body, direct, storage = _implicit_gemm_body(cv, ctx, geo, ops, E, x, bp, o0, pro_args, bn, ctx.bf16_values)
    narrow = (PackedWeight(cv.weight, layout={"narrow": "conv_narrow_bf16", "padded": "conv_bf16_cpad"}[direct]),) \
        if direct in ("narrow", "padded") else ()
    kernel = kir.Kernel(ctx.name, tuple(ext), (o0,), (x, bp, *ops.buffers, *pro_bufs, *((bn,) if narrow else ())),
                        tuple(body), (*ctx.symbols, ROW_STRIDE))
    low = bf16.active(ctx.options)
    how = {"direct": "taps read from a padded bf16 copy on AMX tiles (the implicit GEMM where a call finds none)",
           "padded": "taps read from a padded bf16 copy, its pixels padded with zero channels to 16s, on AMX tiles "
                     "(the implicit GEMM where a call finds none)",
           "narrow": "narrow window rows read from a padded bf16 copy on AMX tiles (the implicit GEMM where a call "
                     "finds none)"}.get(direct, "implicit GEMM on packed weights")
    if pro_args:
        how += "; its input's per-channel scale, shift and Relu applied as its rows are rounded"
    how += conv_storage.describe(storage)
    return Lowered(kernel, cv.outputs, (cv.inputs[0], _direct_weight(cv, ctx, geo), *ops.ptrs, *pro_names, *narrow),
                   needs=("conv", "packed_gemm", "packed_gemm_bf16", *(("conv_amx",) if direct else ()))
                   if low else ("conv",), row_stride=True,
                   method=f"{how}; {bf16.method(ctx.options)}" if low else how, storage=storage)


def _conv_layout(precision: str) -> str:
    """The packing of an implicit GEMM's (or a 1x1's) weights at `precision`: the tiles ds_conv_tile2 or its bf16
    twins read."""
    return {"bf16": "conv_bf16", "bf16-emulated": "conv_bf16e"}.get(precision, "conv")


def _direct_weight(cv: Conv, ctx: LowerCtx, geo: dict) -> PackedWeight:
    """The implicit GEMM's packed weights."""
    return PackedWeight(cv.weight, layout=_conv_layout(ctx.options.precision), groups=geo["G"])


def _bf16_tile(ctx: LowerCtx, body: list) -> tuple[kir.Var, kir.Var, int]:
    """The bf16 tile function's address and the call's epoch, bound at the head of `body` (Winograd's positions
    and a chain's 1x1 call the tile through its address: their library does not link the bf16 one), and whether
    its weights are bf16 pairs (1) or rounded float32 panels (0)."""
    getter, half = bf16.winograd_tile(ctx.options)
    tile_at, ep = kir.Var("tile"), kir.Var("ep")
    body += [kir.Let(tile_at, kir.Call(getter, (), I64)), kir.Let(ep, kir.Call("ds_bf16_epoch", (), I64))]
    return tile_at, ep, half


def _implicit_gemm_body(cv: Conv, ctx: LowerCtx, geo: dict, ops, E: dict, x: kir.Buffer, bp: kir.Buffer,
                        o0: kir.Buffer, pro_args: tuple = (), bn: kir.Buffer | None = None,
                        bf16_values: frozenset[str] | None = None
                        ) -> tuple[list[kir.Stmt], str | None, conv_storage.Storage | None]:
    """The whole call as an implicit GEMM: input x, packed weights bp (_direct_weight), output o0; E with "LD".
    And whether its taps are read from a padded copy on AMX tiles where the call finds them (conv_amx): "direct"
    (a multiple of 16 channels, stride 1), "padded" (other channels past 8, stride 1: the copy's pixels padded with
    zero channels to 16s, the weights bn packed "conv_bf16_cpad" alike), "narrow" (at most 8 channels, any stride:
    the weights bn, packed "conv_narrow_bf16"), bn an input of the kernel then; None; the implicit GEMM kept for a
    call that finds none. And (`bf16_values` given: the kernel's own body, not Winograd's fallback) which of its
    values it can take stored as bf16 and takes so (conv_storage)."""
    node, oc, cg, ocg = cv.node, geo["OC"], geo["CG"], geo["OCG"]
    zeros = kir.Buffer("zeros", kir.F32, const=False)
    bias, act, res = _finish_in_tiles(cv, ctx, ops, residual=True)
    geo_buf, body = _geo_array(geo, E, act)
    done = bool(act) or res is not None  # the tiles finish the values: no epilogue
    bias_arg, res_arg = (_operand_addr(ops, v) for v in (bias, res))
    # a tile is a block of pixels times a pair of panels (64 output channels: ds_conv_tile2's 6 x 64 micro-tiles
    # read each input value once for both), or a group's last, odd panel
    pairs = (ocg + 2 * NR - 1) // (2 * NR)
    pixels = kir.product([E["N"], E["OH"], E["OW"]])
    flops = pixels * (oc * geo["KH"] * geo["KW"] * cg)
    # few pixels by large weights (a classifier's 1x1 conv on the pooled 1x1 map): the threads share the stream
    weights_shared = oc * geo["KH"] * geo["KW"] * cg >= ctx.options.par_min_weights
    par = kir.Const(1, I64) if weights_shared else flops >= ctx.options.par_min_flops
    threads = kir.Var("NT")
    gp = geo["G"] * pairs
    body.append(kir.Let(threads, kir.Select(par, kir.Call("omp_get_max_threads", (), I64), i64(1))))
    want = threads * MIN_TILES_PER_THREAD
    # AMX tiles take 16 pixels at a time (csrc/ds_gemm_bf16.c), and wait on the weights' tiles, which each block of
    # pixels streams again from L2: blocks of 128 pixels there (resnet18_nn 224x224 bf16 6.35 -> 5.83 ms against 64)
    amx = bf16.amx_tiles(ctx.options)
    rows, micro, align = (2 * AMX_TILING.block, AMX_TILING.align, AMX_TILING.align) if amx else (ROWS, MICRO_ROWS,
                                                                                               BLOCK_ALIGN)
    # bf16: the block's patches gathered and rounded once per call and thread (the epoch), weights in pairs
    low = bf16.active(ctx.options)
    ep = kir.Var("ep")
    tile_fn, low_args = (bf16.conv_call(ctx.options), (ep,)) if low else ("ds_conv_tile2", ())
    if pro_args:  # the prologue: the bf16 tiles' entry that applies it (ds_gemm_bf16.h)
        tile_fn, low_args = f"{tile_fn}_pre", (*low_args, *pro_args)
    # a bias the tiles add is not the epilogue's to add again (it sees the node without it); an activation they
    # apply leaves no epilogue
    seen = _without_bias(node) if bias is not None else node
    r, j = kir.Var("r"), kir.Var("j")

    def epilogue(p0: kir.Expr, p1: kir.Expr, gi: kir.Expr, q: kir.Expr) -> list[kir.Stmt]:
        if done:
            return []
        col0 = gi * ocg + q * NR
        col1 = gi * ocg + kir.Select((q + 2) * NR < ocg, (q + 2) * NR, i64(ocg))
        loop = epilogue_loop(ctx.graph, ops, seen, cv.epilogue, cv.outputs[0], o0, r * E["LD"] + j, r, j,
                             (col0, col1), oc)
        return [kir.For(r, p1, tuple(loop), start=p0)] if loop else []

    def tiles(pixels: kir.Expr, call) -> list[kir.Stmt]:
        """The tiles of `pixels` rows in blocks (call(p0, p1, g, q) computes one)."""
        # the pixels in NBLK blocks of about ROWS, more where the tiles would not give each thread
        # MIN_TILES_PER_THREAD of them (SqueezeNet's 1x1 convs on 9x15 maps: 5 blocks of one panel pair, shared
        # 3 / 2 between two threads), as many as a multiple of the threads, and of equal size to a micro-tile: the
        # threads share the tiles in equal runs, so one that got 60 + 60 pixels while the other got 60 + 16 (a
        # 14x14 map's 196 in blocks of 60) kept its team waiting: 256 -> 256 1x1 on 14x14 at 2 threads ran 148 us,
        # 122 balanced
        blocks, b0, bt = kir.Var("NBLK"), kir.Var("NB0"), kir.Var("NBT")
        gq, pb, gi, q, p0, p1 = (kir.Var(v) for v in ("gq", "pb", "g", "q", "p0", "p1"))
        by_rows = (pixels + (rows - 1)) / rows
        by_want = kir.minimum((want + gp - 1) / gp, (pixels + (micro - 1)) / micro)
        made: list[kir.Stmt] = [
            kir.Let(b0, kir.Select(by_rows * gp < want, kir.maximum(by_rows, by_want), by_rows)),
            kir.Let(bt, (b0 + threads - 1) / threads * threads),
            kir.Let(blocks, kir.Select(bt * align <= pixels, bt, b0))]

        def bound(b: kir.Expr) -> kir.Expr:
            """Where block b starts: an equal share of the pixels, down to a multiple of the micro-tile's pixels."""
            return kir.Select(b < blocks, b * pixels / blocks / align * align, pixels)

        tile = [kir.Let(gi, gq / pairs), kir.Let(q, (gq % pairs) * 2), kir.Let(p0, bound(pb)),
                kir.Let(p1, bound(pb + 1)), call(p0, p1, gi, q), *epilogue(p0, p1, gi, q)]
        # panel-major: each thread's consecutive tiles share a pair of panels of weights, which stays in L2
        # meanwhile; block-major where all the weights stay in L2 anyway (<= BLOCK_MAJOR_BYTES): a block's tiles
        # then read and write the same rows one after another (its epilogue's residual rows arrive as one stream,
        # not 64 columns of every row at a time)
        # (AMX: block-major up to AMX_BLOCK_MAJOR_BYTES of bf16 weights, as a block's gathered patches, which
        # panel-major would gather again for each pair, cost as much as its products there)
        weights = geo["G"] * pairs * 2 * NR * geo["KH"] * geo["KW"] * cg
        block_major = 2 * weights <= AMX_BLOCK_MAJOR_BYTES if amx else 4 * weights <= BLOCK_MAJOR_BYTES
        by_pair, by_block = (gq, i64(geo["G"] * pairs)), (pb, blocks)
        (v0, n0), (v1, n1) = (by_block, by_pair) if block_major else (by_pair, by_block)
        # panel-major with a group's last pair a single panel (an odd count: 96 = 3 x 32 channels): the tiles
        # dealt round-robin, so each thread takes its share of every pair's blocks; in equal runs one thread got
        # the two-panel pair's tiles and the other the one-panel pair's (2:1)
        odd = not block_major and -(-ocg // NR) % 2 == 1
        omp = kir.Omp(parallel=True, collapse=2, if_=par, schedule="static, 1" if odd else "static")
        return [*made, kir.For(v0, n0, (kir.For(v1, n1, tuple(tile)),), omp=omp)]

    if low:
        body.append(kir.Let(ep, kir.Call("ds_bf16_epoch", (), I64)))
    gathered = [kir.Alloc(zeros, i64(cg), zero=True),
                *tiles(pixels, lambda p0, p1, gi, q: _call(tile_fn, kir.Addr(geo_buf), kir.Addr(x), kir.Addr(bp),
                                                           kir.Addr(o0), kir.Addr(zeros), p0, p1, gi, q, bias_arg,
                                                           res_arg, *low_args)),
                kir.Free(zeros)]
    # (the direct tiles store output pixels, not rows of a block: no epilogue loop after them)
    kind = "direct" if conv_amx.fits(geo, ctx.options) else \
        "narrow" if bn is not None and conv_amx.narrow_fits(geo, ctx.options) else \
        "padded" if bn is not None and conv_amx.padded_fits(geo, ctx.options) else None
    finished = not epilogue(i64(0), i64(0), i64(0), i64(0))
    gathered_only = kind is None or not finished or bool(pro_args)
    storage = None if not low or bf16_values is None or (kind == "narrow" and not gathered_only) else \
        conv_storage.storage_of(None if pro_args else cv.inputs[0], cv.outputs[0] if finished else None, res,
                                bf16_values)  # bf16 storage: the gathered and the direct tiles, not the narrow ones
    body += conv_storage.flag_stores(geo_buf, storage)
    if gathered_only:
        if kind == "narrow" and bf16_too_narrow(geo, ctx.options.bf16_min_conv_macs):
            raise _GatheredInstead
        return body + gathered, None, storage
    xp = kir.Buffer("xp", kir.F32, const=False)
    if kind == "direct":  # AMX, stride 1, whole tiles of channels: the taps read from a padded bf16 copy per call
        fill, free = conv_amx.padded(geo_buf, x, E["N"], E["N"] * (E["OH"] + (geo["KH"] - 1)), xp, par)
        direct = [*fill, *tiles(conv_amx.rows(geo_buf, E["N"]), lambda p0, p1, gi, q: conv_amx.tile(
            geo_buf, xp, bp, o0, p0, p1, q, bias_arg, res_arg)), free]
    elif kind == "padded":  # the same, the copy's pixels padded with zero channels to 16s (weights bn alike)
        geo_p, made = _geo_array(conv_amx.padded_geometry(geo), E, act, name="geo_p")
        made += conv_storage.flag_stores(geo_p, storage)
        fill, free = conv_amx.padded(geo_p, x, E["N"], E["N"] * (E["OH"] + (geo["KH"] - 1)), xp, par,
                                     from_channels=geo["C"])
        direct = [*made, *fill, *tiles(conv_amx.rows(geo_p, E["N"]), lambda p0, p1, gi, q: conv_amx.tile(
            geo_p, xp, bn, o0, p0, p1, q, bias_arg, res_arg)), free]
    else:  # AMX, a few channels, any stride: whole window rows read from a padded copy of Cp-channel pixels
        rows_each = (E["OH"] - 1) * geo["SH"] + geo["KH"]
        fill, free = conv_amx.padded(geo_buf, x, E["N"], E["N"] * rows_each, xp, par, narrow=True)
        direct = [*fill, *tiles(conv_amx.narrow_rows(geo_buf, E["N"]), lambda p0, p1, gi, q: conv_amx.narrow_tile(
            geo_buf, xp, bn, o0, p0, p1, q, bias_arg, res_arg)), free]
    return [*body, kir.If(conv_amx.on_tiles(), tuple(direct), tuple(gathered))], kind, storage


# tiles per chunk of ds_wino_f2 / ds_wino_f4 (ds_shared.h's DS_WINO_TILES, DS_WINO4_TILES): a chunk's V and M stay
# in L2 for 256 + 256 channels
WINO_TILES = cshared.WINO_TILES


WINO4_MAX_WEIGHTS = 512 * 512  # C * OC from which F(2x2) is kept: 36 weight matrices a chunk outweigh the products
WINO_SMALL_WEIGHTS = 256 << 10  # transformed weights this small stay in L2: blocks need not fill a chunk
WINO_TYPICAL_SIDE = 256  # the value every symbol takes when judging a runtime map size (an image side, a length)
WINO4_MIN_SIDE = 24  # output rows and columns at that value from which F(4x4) pays (weights not packed twice)
WINO4_MIN_TILES = 16  # F(4x4) tiles of a call (all images) from which its 36 weight matrices a chunk pay
WINO4_MAX_WORK = 0.67  # F(4x4)'s products over F(2x2)'s (tiles x 36 / tiles x 16) up to which F(4x4) pays
WINO_BOTH_BYTES = 5 << 19  # F(4x4) weights up to 2.5 MB are packed beside the F(2x2) ones: the call chooses


def wino4_pays(n, oh, ow, div=lambda a, b: a // b):
    """Whether F(4x4) beats F(2x2) on a call's map: its tiles (all images) at least WINO4_MIN_TILES, and its
    products (36 a tile) at most WINO4_MAX_WORK of F(2x2)'s (16 a tile), edge tiles' waste included. Measured
    standalone, hot, 1 thread (F(4x4) / F(2x2) time): 15x15 and 19x19 maps 0.78-0.86 for 16..192 x 64..320
    channels (work ratio 0.56); 13x13 and 14x14 0.95-1.09 (0.73); 9x9 and 10x10 1.04-1.35 (0.81); 7x7 and 11x11
    0.86-1.42, the large weights losing (0.56 but 4 or 9 tiles). `div`: integer division, so that the same rule
    is the static build's choice (ints) and the generic build's per call (kir expressions, in C): a tuple of
    the two conditions, both true where F(4x4) pays."""
    t4 = div(oh + 3, 4) * div(ow + 3, 4)
    t2 = div(oh + 1, 2) * div(ow + 1, 2)
    return n * t4 >= WINO4_MIN_TILES, 3600 * t4 <= int(WINO4_MAX_WORK * 1600) * t2


def winograd_tiles(geo: dict, preferred: int) -> tuple[int, ...]:
    """The output tiles a 3x3 conv's Winograd may use: (2,) F(2x2), (4,) F(4x4), or (4, 2): both packed, the call
    choosing by `wino4_pays` on its map. F(2x2) for weights of WINO4_MAX_WEIGHTS and more whatever the map (deep
    layers run on small maps: Inception v2's 7x7 convs ran 1.49 ms with F(4x4) against 0.62 with F(2x2)). A
    static map takes `wino4_pays`; a runtime one both where F(4x4)'s weights are at most WINO_BOTH_BYTES (so a
    generic build runs each shape as its static build would: SqueezeNet's 64 -> 256 convs at 320x320 run on
    19x19 maps, F(4x4) 20% faster there, while 224x224 gives 13x13, where F(2x2) is), else the one F(4x4)
    takes where every map side is WINO4_MIN_SIDE or more at WINO_TYPICAL_SIDE (a map of H // 16 is 16 there:
    F(2x2); H // 8 is 32: F(4x4))."""
    if preferred == 2 or geo["C"] * geo["OC"] >= WINO4_MAX_WEIGHTS:
        return (2,)
    n, oh, ow = geo["N"], geo["OH"], geo["OW"]
    if all(isinstance(d, int) for d in (n, oh, ow)):
        return (4,) if all(wino4_pays(n, oh, ow)) else (2,)
    if 36 * 4 * geo["C"] * geo["OC"] <= WINO_BOTH_BYTES:
        return (4, 2)
    for d in (oh, ow):
        typical = _typical(d)
        if typical is None or typical < WINO4_MIN_SIDE:
            return (2,)
    return (4,)


def _typical(d) -> int | None:
    """A dim at WINO_TYPICAL_SIDE for every symbol (None where it cannot be evaluated)."""
    if isinstance(d, int):
        return d
    try:
        return int(d.evaluate({s: WINO_TYPICAL_SIDE for s in d.free_symbols}))
    except (ArithmeticError, ValueError):
        return None


def _winograd(cv: Conv, ctx: LowerCtx, geo: dict, ops, ext: list, E: dict, tiles: tuple[int, ...] = (2,),
              direct: bool = False) -> Lowered:
    """F(m x m, 3x3) (csrc/ds_conv_dw_wino.c's ds_wino_f2 / ds_wino_f4) over blocks of whole tile rows (m output rows
    each): a block's output pixels are one contiguous range, so its epilogue runs over them while they are in
    cache. A block takes as many tile rows as fill one chunk of WINO_TILES[m] tiles, since every chunk streams
    all (m + 2)^2 weight matrices (a 7x7 map's rows of 4 tiles would otherwise stream them per 4 tiles).
    With at least 4 blocks a thread, OpenMP shares out the blocks (each thread its own scratch); with fewer
    (small maps), the blocks run one after another and the whole team shares each chunk phase by phase
    (the C function's `par`): per-thread blocks left a 28x28 map's three blocks unevenly shared, and sharing every
    chunk cost a 55x55 map with 16 channels more in barriers than its products take.
    `tiles` (winograd_tiles): one m, or (4, 2): both weight packings, the call taking F(4x4) where `wino4_pays`
    on its map (the F(4x4) weights are the kernel's last input). `direct` (direct_beside): the implicit GEMM's
    packed weights too, after those, the call taking it where Winograd does not pay (`wino_pays`)."""
    node, c, oc = cv.node, geo["C"], geo["OC"]
    ext, E = [*ext, sym(ROW_STRIDE)], {**E, "LD": kir.Extent(len(ext))}
    o0 = kir.Buffer("o0", kir.F32, const=False)
    x = kir.Buffer("i0")
    packs = {tiles[-1]: kir.Buffer("i1")}
    if len(tiles) == 2:
        packs[tiles[0]] = kir.Buffer(f"i{2 + len(ops.buffers)}")
    zeros = kir.Buffer("zeros", kir.F32, const=False)
    scratch = kir.Buffer("scratch", kir.F32, const=False)
    bias, act, _ = _finish_in_tiles(cv, ctx, ops)
    bias_arg = _operand_addr(ops, bias)
    geo_buf, body = _geo_array(geo, E, act)
    names = ("TW", "TH", "TR", "R", "par", "b", "r0", "r1", "p0", "p1", "r", "j", "NB")
    tw, th, rows, per, par, b, r0, r1, p0, p1, r, j, nb = (kir.Var(v) for v in names)
    pixels = kir.product([E["N"], E["OH"], E["OW"]])
    threads = kir.Call("omp_get_max_threads", (), I64)
    body.append(kir.Let(par, pixels * (oc * 9 * c) >= ctx.options.par_min_flops))
    # bf16: each position's product on the bf16 tiles (their address from the bf16 library, the call's epoch)
    low = bf16.active(ctx.options)
    low_args: tuple[kir.Expr, ...] = ()
    if low:
        tile_at, ep, half = _bf16_tile(ctx, body)
        low_args = (tile_at, ep, i64(half))
    seen = _without_bias(node) if bias is not None else node  # the output transform adds it (and the activation)
    epilogue = [] if act else epilogue_loop(ctx.graph, ops, seen, cv.epilogue, cv.outputs[0], o0, r * E["LD"] + j,
                                             r, j, (i64(0), i64(oc)), oc)

    def run(m: int) -> tuple[kir.Stmt, ...]:
        """The whole call with F(m x m)."""
        chunk, fn = WINO_TILES[m], f"ds_wino_f{m}"
        fill = kir.Select(tw >= chunk, i64(1), i64(chunk) / tw)  # tile rows that fill a chunk
        if (m + 2) ** 2 * c * oc * 4 <= WINO_SMALL_WEIGHTS:
            # weights that stay in L2 across chunks: smaller blocks, so that every thread gets 4 of them
            # (SqueezeNet's 16 -> 64 expand on 55x55: 5 blocks of 3 tile rows shared chunk by chunk scaled 1.24x on
            # 2 threads)
            spread = kir.Select(rows >= threads * 4, rows / (threads * 4), fill)  # (too few rows: one shared chunk)
            fill = kir.Select(spread < fill, spread, fill)

        def first_pixel(e: kir.Expr) -> kir.Expr:  # of flat tile row e = (image, tile row)
            return ((e / th) * E["OH"] + (e % th) * m) * E["OW"]

        def block(shared: bool) -> tuple[kir.Stmt, ...]:
            """One block; `shared`: the team shares its chunks (and its epilogue), else one thread runs it."""
            stmts: list[kir.Stmt] = [
                kir.Let(r0, b * per), kir.Let(r1, kir.Select(r0 + per < rows, r0 + per, rows)),
                _call(fn + ("_t" if low and m == 2 else ""), kir.Addr(geo_buf), kir.Addr(x), kir.Addr(packs[m]),
                      kir.Addr(o0), kir.Addr(zeros), r0 * tw, r1 * tw, par if shared else i64(0), kir.Addr(scratch),
                      bias_arg, *(low_args if m == 2 else ()))]
            if epilogue:
                stmts += [kir.Let(p0, first_pixel(r0)), kir.Let(p1, first_pixel(r1)),
                          kir.For(r, p1, tuple(epilogue), start=p0,
                                  omp=kir.Omp(parallel=True, if_=par) if shared else None)]
            return tuple(stmts)

        size = i64(_wino_scratch(m, c, oc) // 4)
        per_thread = kir.Region((kir.Alloc(scratch, size), kir.For(b, nb, block(False), omp=kir.Omp(shared=True)),
                                 kir.Free(scratch)))
        team = (kir.Alloc(scratch, size), kir.For(b, nb, block(True)), kir.Free(scratch))
        return (kir.Let(tw, (E["OW"] + (m - 1)) / m), kir.Let(th, (E["OH"] + (m - 1)) / m),
                kir.Let(rows, E["N"] * th), kir.Let(per, fill), kir.Let(nb, (rows + per - 1) / per),
                kir.Alloc(zeros, i64(c), zero=True), kir.If(kir.Bin("&&", par, nb >= threads * 4), (per_thread,), team),
                kir.Free(zeros))

    div = lambda v, k: v / i64(k)  # noqa: E731 (integer division in C)
    if len(tiles) == 2:
        enough, cheaper = wino4_pays(E["N"], E["OH"], E["OW"], div=div)
        wino: tuple[kir.Stmt, ...] = (kir.If(kir.Bin("&&", enough, cheaper), run(4), run(2)),)
    else:
        wino = run(tiles[0])
    inputs = [x, packs[tiles[-1]], *ops.buffers, *([packs[tiles[0]]] if len(tiles) == 2 else [])]
    suffix = {"bf16": "_bf16", "bf16-emulated": "_bf16e"}.get(ctx.options.precision, "")
    weights: list[PackedWeight] = [PackedWeight(cv.weight, layout="winograd" + suffix if m == 2 else "winograd4")
                                   for m in tiles]  # (F(4x4) is float32 under bf16 too: bf16_winograd_too_narrow)
    method = "Winograd F(4x4) where it pays on the call's map (wino4_pays), else F(2x2): both packed" \
        if len(tiles) == 2 else f"Winograd F({tiles[0]}x{tiles[0]})"
    needs = ("conv_dw_wino", "packed_gemm", "packed_gemm_bf16") if low else ("conv_dw_wino",)
    if direct:
        bp = kir.Buffer(f"i{len(inputs)}")
        inputs.append(bp)
        weights.insert(-1, _direct_weight(cv, ctx, geo))
        pays = wino_pays(E["N"], E["OH"], E["OW"], ctx.options.winograd_min_tiles, div=div)
        body.append(kir.If(pays, wino, tuple(_implicit_gemm_body(cv, ctx, geo, ops, E, x, bp, o0)[0])))
        method += f"; implicit GEMM where the call's map has under {ctx.options.winograd_min_tiles} F(2x2) tiles " \
                  "(wino_pays)"
        needs = (*needs, "conv")
    else:
        body += wino
    if low:
        method += f"; F(2x2)'s products {bf16.method(ctx.options)}, F(4x4)'s float32" if 4 in tiles \
            else f"; products {bf16.method(ctx.options)}"
    kernel = kir.Kernel(ctx.name, tuple(ext), (o0,), tuple(inputs), tuple(body), (*ctx.symbols, ROW_STRIDE))
    return Lowered(kernel, cv.outputs, (node.inputs[0], weights[-1], *ops.ptrs, *weights[:-1]), needs=needs,
                   row_stride=True, scratch_bytes=max(_wino_scratch(m, c, oc) for m in tiles), method=method)


def _wino_scratch(m: int, c: int, oc: int) -> int:
    """Bytes of a Winograd block's scratch: a chunk's transformed inputs and products."""
    return 4 * (m + 2) ** 2 * WINO_TILES[m] * (c + oc)


def _depthwise(cv: Conv, ctx: LowerCtx, geo: dict, ops, ext: list, E: dict) -> Lowered:
    """Per output row, `ds_dwconv_row` (csrc/ds_conv_dw_wino.c: 16 channels x 8 interior pixels in registers, masked
    channel tails), with the conv's per-channel bias; then the epilogue over the row while it is in L1."""
    node, c = cv.node, geo["C"]
    o0 = kir.Buffer("o0", kir.F32, const=False)
    x, wt = kir.Buffer("i0"), kir.Buffer("i1")
    _, act, _ = _finish_in_tiles(cv, ctx, ops)  # an activation that is the whole epilogue: ds_dwconv_row applies it
    geo_buf, body = _geo_array(geo, E, act)
    nho, n, ho, r, j = (kir.Var(v) for v in ("nho", "n", "ho", "r", "j"))
    oh, ow = E["OH"], E["OW"]
    bias, in_c = _bias_operand(node, ops)
    bias_arg = _operand_addr(ops, bias) if in_c else kir.NULL
    # a bias the C applied is not the epilogue's to add again: it sees the node without it
    seen = _without_bias(node) if in_c else node
    epilogue = [] if act else epilogue_loop(ctx.graph, ops, seen, cv.epilogue, cv.outputs[0], o0, r * c + j, r, j,
                                            (i64(0), i64(c)), c)
    row = [kir.Let(n, nho / oh), kir.Let(ho, nho % oh),
           _call("ds_dwconv_row", kir.Addr(geo_buf), kir.Addr(x), kir.Addr(wt), bias_arg,
                 kir.Addr(o0, nho * ow * c), n, ho)]
    if epilogue:
        row.append(kir.For(r, (nho + 1) * ow, tuple(epilogue), start=nho * ow))
    work = kir.product([E["N"], oh, ow, i64(c * geo["KH"] * geo["KW"])])
    par = kir.Omp(parallel=True, if_=work >= ctx.options.par_min_elements)
    body.append(kir.For(nho, E["N"] * oh, tuple(row), omp=par))
    kernel = kir.Kernel(ctx.name, tuple(ext), (o0,), (x, wt, *ops.buffers), tuple(body), ctx.symbols)
    return Lowered(kernel, cv.outputs, (node.inputs[0], PackedWeight(cv.weight, layout="taps"), *ops.ptrs),
                   needs=("conv_dw_wino",), method="depthwise rows in C: " + (
                       "16 channels x 8 pixels in registers" if c >= 16 else "a row's pixels as one flat run"))


def _depthwise_loops(cv: Conv, ctx: LowerCtx, geo: dict, ops, ext: list, E: dict) -> Lowered:
    """Few channels: per output pixel, the taps accumulated into a row of C floats (in L1), then the epilogue."""
    node, c = cv.node, geo["C"]
    o0 = kir.Buffer("o0", kir.F32, const=False)
    x, wt = kir.Buffer("i0"), kir.Buffer("i1")
    acc = kir.Buffer("acc", kir.F32, const=False)
    nho, n, ho, wo, r, j = (kir.Var(v) for v in ("nho", "n", "ho", "wo", "r", "j"))
    ch, ch_init, ch_out = kir.Var("c"), kir.Var("c"), kir.Var("c")  # one variable per channel loop
    kh, kw, ih, iw, base = (kir.Var(v) for v in ("kh", "kw", "ih", "iw", "base"))
    H, W, oh, ow = E["H"], E["W"], E["OH"], E["OW"]
    simd = kir.Omp(simd=True, schedule=None)
    tap = kh * geo["KW"] + kw
    accumulate = kir.For(ch, i64(c), (kir.Store(acc, ch, kir.Load(acc, ch) + kir.Load(x, base + ch)
                                               * kir.Load(wt, tap * c + ch)),), omp=simd)
    per_kw = kir.For(kw, i64(geo["KW"]), (
        kir.Let(iw, wo * geo["SW"] - E["PL"] + kw * geo["DW"]),
        kir.If(kir.Bin("&&", iw >= 0, iw < W), (kir.Let(base, ((n * H + ih) * W + iw) * c), accumulate)),))
    per_kh = kir.For(kh, i64(geo["KH"]), (
        kir.Let(ih, ho * geo["SH"] - E["PT"] + kh * geo["DH"]),
        kir.If(kir.Bin("&&", ih >= 0, ih < H), (per_kw,))))
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    zero = kir.Const(0.0, kir.F32)
    init = kir.Load(ops.buffers[ops.ptrs.index(bias)], ch_init) if bias in ops.ptrs else \
        ops.scalars.get(bias, zero) if bias else zero
    store = kir.For(ch_out, i64(c), (kir.Store(o0, r * c + ch_out, kir.Load(acc, ch_out)),), omp=simd)
    # the bias is in `acc` already: the epilogue sees the node without it
    bare = _without_bias(node)
    epilogue = epilogue_loop(ctx.graph, ops, bare, cv.epilogue, cv.outputs[0], o0, r * c + j, r, j, (i64(0), i64(c)), c)
    pixel = (kir.Let(r, nho * ow + wo), kir.For(ch_init, i64(c), (kir.Store(acc, ch_init, init),), omp=simd),
             per_kh, store, *epilogue)
    rows = kir.For(nho, E["N"] * oh, (kir.Let(n, nho / oh), kir.Let(ho, nho % oh), kir.For(wo, ow, pixel)),
                   omp=kir.Omp(shared=True))
    work = kir.product([E["N"], oh, ow, i64(c * geo["KH"] * geo["KW"])])
    body = [kir.Region((kir.Alloc(acc, i64(c)), rows, kir.Free(acc)), if_=work >= ctx.options.par_min_elements)]
    kernel = kir.Kernel(ctx.name, tuple(ext), (o0,), (x, wt, *ops.buffers), tuple(body), ctx.symbols)
    return Lowered(kernel, cv.outputs, (node.inputs[0], PackedWeight(cv.weight, layout="taps"), *ops.ptrs),
                   method="depthwise: a loop nest per pixel (few channels)")


PWDW_SCRATCH_BYTES = 512 << 10  # a chunk's rows of the expanded map: they and the depthwise's reads stay in L2
PWDW_MIN_MAP_BYTES = 1 << 20  # the expanded map of one image (at WINO_TYPICAL_SIDE) from which the chain pays


def lower_conv_chain(ch: ConvChain, ctx: LowerCtx) -> Lowered:
    """A 1x1 conv (stride 1, one group, finished in its tiles) into the depthwise conv that alone reads it, per
    chunk of the depthwise's output rows of one image (OpenMP over the chunks): csrc/ds_conv_dw_wino.c's ds_pwdw_rows
    computes the expanded rows the chunk reads into per-thread scratch, then the depthwise rows from there; the
    depthwise's epilogue (other than an activation its C applies) runs over each chunk's rows after."""
    pw, dw, g = ch.first, ch.second, ctx.graph
    for cv in (pw, dw):
        computable(tuple(cv.shape), ctx.key_names)
        computable(tuple(g.types[cv.node.inputs[0]].shape), ctx.key_names)
    gp, gd = geometry(pw, ctx), geometry(dw, ctx)
    if (gp["KH"], gp["KW"], gp["SH"], gp["SW"], gp["G"]) != (1, 1, 1, 1, 1) or gd["CG"] != 1 or gd["OCG"] != 1 \
            or not all(isinstance(gd[k], int) for k in ("C", "KH", "KW")) or gp["OC"] != gd["C"]:
        raise Unsupported("not a 1x1 stride-1 ungrouped conv into a depthwise one")
    h, w = _typical(gd["H"]), _typical(gd["W"])
    if h is None or w is None or h * w * gd["C"] * 4 < PWDW_MIN_MAP_BYTES:
        # small maps stay in L2 between two kernels anyway, and the chain's chunks recompute the rows they share
        # (text_det's 30x40 stage-2 blocks ran 5-15% slower chained)
        raise Unsupported("the expanded map is small: two kernels")
    ops_p = operands(pw.inputs[1:], tuple(pw.shape), g, first_param=2)
    bias_p, act_p, res_p = _finish_in_tiles(pw, ctx, ops_p)
    if res_p is not None or (pw.epilogue is not None and not act_p) or not all(row_pattern(p) for p in ops_p.patterns):
        raise Unsupported("the 1x1 conv's epilogue is not finished in its tiles")
    shape = tuple(dw.shape)
    ops_d = operands(dw.inputs[1:], shape, g, first_param=3 + len(ops_p.ptrs))
    if not all(row_pattern(p) for p in ops_d.patterns):
        raise Unsupported("an epilogue operand is neither a full tensor, a per-channel vector nor one value")
    names = ("N", "H", "W", "OH", "OW", "PT", "PL")
    ext = [gd[k] for k in names]
    E = {k: kir.Extent(i) for i, k in enumerate(names)}
    Ep = {"N": E["N"], "H": E["H"], "W": E["W"], "OH": E["H"], "OW": E["W"]}
    geo_p, body = _geo_array(gp, Ep, act_p, npix=i64(-1))
    _, act_d, _ = _finish_in_tiles(dw, ctx, ops_d)
    geo_d, body_d = _geo_array(gd, E, act_d)
    body += body_d
    o0 = kir.Buffer("o0", kir.F32, const=False)
    x, bp, wd = kir.Buffer("i0"), kir.Buffer("i1"), kir.Buffer(f"i{2 + len(ops_p.ptrs)}")
    zeros, scratch = kir.Buffer("zeros", kir.F32, const=False), kir.Buffer("scratch", kir.F32, const=False)
    c = gd["C"]
    node_d = dw.node
    bias_d, in_c = _bias_operand(node_d, ops_d)  # a per-channel vector the depthwise C adds
    bias_d_arg = _operand_addr(ops_d, bias_d) if in_c else kir.NULL
    if bias_d is not None and not in_c:
        raise Unsupported("the depthwise conv's bias is not a per-channel vector")
    rows, chunks, nc, n, ho0, ho1, r = (kir.Var(v) for v in ("R", "NCH", "nc", "n", "ho0", "ho1", "r"))
    j, c0, nt, cap = kir.Var("j"), kir.Var("NCH0"), kir.Var("NT"), kir.Var("RF")
    oh, ow = E["OH"], E["OW"]
    row_bytes = E["W"] * (gd["SH"] * c * 4)
    fit = i64(PWDW_SCRATCH_BYTES) / row_bytes
    work = kir.product([E["N"], E["H"], E["W"], i64(c * gp["C"])])
    par = work >= ctx.options.par_min_flops
    # an image's rows in as many chunks as fit the scratch, rounded up to a multiple of the threads (at most one a
    # row), each an equal share of the rows to one row: chunks of `fit` rows left the last one short, and the
    # threads' static shares unequal (a 56-row map in chunks of 16 rows on 2 threads: 32 rows against 24)
    body += [kir.Let(cap, kir.Select(fit < i64(1), i64(1), kir.Select(fit > oh, oh, fit))),
             kir.Let(nt, kir.Select(par, kir.Call("omp_get_max_threads", (), I64), i64(1))),
             kir.Let(c0, (oh + cap - 1) / cap),
             kir.Let(chunks, kir.minimum((c0 + nt - 1) / nt * nt, oh)),
             kir.Let(rows, (oh + chunks - 1) / chunks)]
    need = ((rows - 1) * gd["SH"] + (gd["KH"] - 1) * gd["DH"] + 1) * E["W"] * c
    seen = _without_bias(node_d) if in_c else node_d
    epilogue = [] if act_d else epilogue_loop(g, ops_d, seen, dw.epilogue, dw.outputs[0], o0, r * c + j, r, j,
                                              (i64(0), i64(c)), c)
    # bf16: the 1x1's product on the bf16 tiles (their address from the bf16 library, the call's epoch), unless
    # it is too narrow to pay (bf16_too_narrow); the depthwise rows stay float32
    low = bf16.active(ctx.options) and not bf16_too_narrow(gp, ctx.options.bf16_min_conv_macs)
    low_args: tuple[kir.Expr, ...] = _bf16_tile(ctx, body)[:2] if low else ()
    chunk = [kir.Let(n, nc / chunks), kir.Let(ho0, (nc % chunks) * oh / chunks),
             kir.Let(ho1, (nc % chunks + 1) * oh / chunks),
             _call("ds_pwdw_rows_t" if low else "ds_pwdw_rows", kir.Addr(geo_p), kir.Addr(geo_d), kir.Addr(x),
                   kir.Addr(bp), _operand_addr(ops_p, bias_p), kir.Addr(wd), bias_d_arg, kir.Addr(o0),
                   kir.Addr(zeros), kir.Addr(scratch), n, ho0, ho1, *low_args)]
    if epilogue:
        chunk.append(kir.For(r, (n * oh + ho1) * ow, tuple(epilogue), start=(n * oh + ho0) * ow))
    loop = kir.For(nc, E["N"] * chunks, tuple(chunk), omp=kir.Omp(shared=True))
    body += [kir.Alloc(zeros, i64(gp["C"]), zero=True),
             kir.Region((kir.Alloc(scratch, need), loop, kir.Free(scratch)), if_=par),
             kir.Free(zeros)]
    kernel = kir.Kernel(ctx.name, tuple(ext), (o0,), (x, bp, *ops_p.buffers, wd, *ops_d.buffers), tuple(body),
                        ctx.symbols)
    layout = _conv_layout(ctx.options.precision if low else "fp32")
    inputs = (pw.node.inputs[0], PackedWeight(pw.weight, layout=layout, groups=1), *ops_p.ptrs,
              PackedWeight(dw.weight, layout="taps"), *ops_d.ptrs)
    method = "1x1 conv into depthwise: a few rows at a time in per-thread scratch"
    return Lowered(kernel, ch.outputs, inputs,
                   needs=("conv_dw_wino", "packed_gemm", "packed_gemm_bf16") if low else ("conv_dw_wino",),
                   method=f"{method}; the 1x1's products {bf16.method(ctx.options)}" if low else method)


_TILE = (P, P, P, P, P, C_I64, C_I64, C_I64, C_I64, P, P)
# Two libraries, compiled at the same time on a cold cache (one file took 2.9 s of gcc, alone on one core while
# the rest of a VGG's build was done): the dense tiles, and the depthwise and Winograd kernels that call them.
LIBRARY = declare("conv", "ds_conv.c", {"ds_conv_tile": _TILE, "ds_conv_tile2": _TILE}, share=True, openmp=True)
DW_WINO_LIBRARY = declare(
    "conv_dw_wino", "ds_conv_dw_wino.c", {"ds_dwconv_row": (P, P, P, P, P, C_I64, C_I64),
                                          "ds_wino_f2": (P, P, P, P, P, C_I64, C_I64, C_I64, P, P),
                                          "ds_wino_f4": (P, P, P, P, P, C_I64, C_I64, C_I64, P, P),
                                          "ds_wino_f2_t": (P, P, P, P, P, C_I64, C_I64, C_I64, P, P, C_I64, C_I64,
                                                           C_I64),
                                          "ds_wino_f4_t": (P, P, P, P, P, C_I64, C_I64, C_I64, P, P, C_I64, C_I64,
                                                           C_I64)},
    share=True, openmp=True, needs=(LIBRARY,))
register_helper("conv", LIBRARY, "ds_conv.h")
register_helper("conv_dw_wino", DW_WINO_LIBRARY, "ds_conv.h")
register_lowering("conv", "kernel", lower_conv)
register_lowering("conv_chain", "kernel", lower_conv_chain)
