"""Direct bf16 convolutions on AMX tiles (csrc/ds_conv_amx.c): which convolutions take them, and the statements
that run one.

Why: on AMX the implicit GEMM's gathered patches (a block's K = KH * KW * C values a pixel, rounded per block and
panel pair) cost as much as the tile products they feed, and the tiles then read them from L2; a stride-1 conv
reads its taps instead from one zero-padded bf16 copy of the input made per call (ds_conv_amx.h's virtual rows).
The kernel keeps the implicit GEMM beside it, taken where the call finds no AMX tiles (a test's
ds_bf16_use_amx(0), an artefact loaded on a CPU without them): the same packed weights serve both.
"""

from __future__ import annotations

from dynshape.codegen import bf16, cshared, kir
from dynshape.codegen.clib import I64 as C_I64
from dynshape.codegen.clib import P, declare
from dynshape.codegen.library import register_helper
from dynshape.options import Options

I64 = kir.I64

LIBRARY = declare("conv_amx", "ds_conv_amx.c", {
    "ds_conv_amx_padded": (P, C_I64), "ds_conv_amx_rows": (P, C_I64),
    "ds_conv_amx_pad": (P, C_I64, P, P, C_I64, C_I64), "ds_conv_amx_pad_from": (P, C_I64, P, P, C_I64, C_I64, C_I64),
    "ds_conv_amx_tile2": (P, P, P, P, C_I64, C_I64, C_I64, P, P),
    "ds_conv_amx_narrow_padded": (P, C_I64), "ds_conv_amx_narrow_rows": (P, C_I64),
    "ds_conv_amx_narrow_pad": (P, C_I64, P, P, C_I64, C_I64),
    "ds_conv_amx_narrow_tile2": (P, P, P, P, C_I64, C_I64, C_I64, P, P)},
    share=True, restypes={"ds_conv_amx_padded": C_I64, "ds_conv_amx_rows": C_I64,
                          "ds_conv_amx_narrow_padded": C_I64, "ds_conv_amx_narrow_rows": C_I64})
register_helper("conv_amx", LIBRARY, "ds_conv_amx.h")


def _on_tiles(geo: dict, options: Options) -> bool:
    """What both direct paths ask: asked for (amx_direct_conv), bf16 on AMX tiles (compile time; the call checks
    again), undilated, ungrouped, static input channels."""
    return (options.amx_direct_conv and (geo["DH"], geo["DW"], geo["G"]) == (1, 1, 1) and isinstance(geo["C"], int)
            and bf16.amx_tiles(options))


def fits(geo: dict, options: Options) -> bool:
    """Whether a conv with geometry `geo` runs its tiles directly from a padded copy here: bf16 on AMX tiles
    (compile time; the call checks again), stride 1, undilated, ungrouped, a window wider than 1x1 (a 1x1 conv's
    gathered rows are its input rows, converted per block in cache: a padded copy would only add a pass through
    memory), input channels a multiple of 16 and a window row of at least 32 values (a tile row's 64 bytes are 32
    values of a window row, KW * C contiguous values in the copy; a row that ends in a half chunk reads its last 32,
    cshared.CONV_AMX_MAX_KH rows at most). 16 channels: UNet's full-resolution convs, ~2x their gathered patches'
    time."""
    if not (_on_tiles(geo, options) and (geo["SH"], geo["SW"]) == (1, 1) and geo["KH"] * geo["KW"] > 1):
        return False
    run = geo["KW"] * geo["C"]
    return geo["C"] % 16 == 0 and run >= 32 and (run % 32 == 0 or geo["KH"] <= cshared.CONV_AMX_MAX_KH)


PAD_MAX_WASTE = 1.5  # padded channels over real ones up to which a direct conv pads its input's channels


def padded_fits(geo: dict, options: Options) -> bool:
    """Whether a conv whose input channels are not a multiple of 16 (more than 8: fewer go narrow) takes the direct
    tiles on a copy whose pixels are padded with zero channels to the next multiple of 16 (weights packed
    "conv_bf16_cpad", zero rows for them): as `fits` on the padded channels, at most PAD_MAX_WASTE as many. Why: its
    gathered patches cost more than the padding's products (a YOLOX stem's 12 -> 24 3x3 on 208x208: 1.8 ms
    gathered)."""
    c = geo["C"]
    if not isinstance(c, int) or c % 16 == 0 or c <= 8:
        return False
    return bf16.padded_channels(c) <= PAD_MAX_WASTE * c and fits(padded_geometry(geo), options)


def padded_geometry(geo: dict) -> dict:
    """The geometry the direct tiles and the padded copy read for a padded_fits conv: its channels padded."""
    cp = bf16.padded_channels(geo["C"])
    return {**geo, "C": cp, "CG": cp}


def narrow_fits(geo: dict, options: Options) -> bool:
    """Whether a conv takes the narrow-window tiles (ds_conv_amx_narrow_tile2): bf16 on AMX tiles, undilated,
    ungrouped, at most 8 input channels and a window row of at most 32 values in the padded copy (KW x Cp: a 7x7
    RGB stem is 7 x 4), any stride. Why: its patches are a few channels gathered from KH x KW pixels each, the
    gather costing more than the products (ResNet-50's 3 -> 64 7x7 stride-2 stem: 857 us gathered, 294 us in
    OpenVINO); read from a padded copy, each tap row of 16 output pixels is one tile load."""
    if not _on_tiles(geo, options):
        return False
    cp = bf16.narrow_channels(geo["C"])
    return cp is not None and geo["KW"] * cp <= cshared.NARROW_ROW


def on_tiles() -> kir.Expr:
    """The call's test: AMX tiles in use now (csrc/ds_gemm_bf16.c's ds_bf16_use_amx(-1))."""
    return kir.Call("ds_bf16_use_amx", (kir.Const(-1, I64),), "int")


def rows(geo_buf: kir.Buffer, n: kir.Expr) -> kir.Expr:
    """The virtual rows of n images (ds_conv_amx_rows): what the blocks divide."""
    return kir.Call("ds_conv_amx_rows", (kir.Addr(geo_buf), n), I64)


def padded(geo_buf: kir.Buffer, x: kir.Buffer, n: kir.Expr, padded_rows: kir.Expr, xp: kir.Buffer,
           par: kir.Expr, narrow: bool = False, from_channels: int | None = None) -> tuple[list[kir.Stmt], kir.Stmt]:
    """(the statements that allocate xp and fill it with the padded bf16 copy of x, its Free): xp is a float
    buffer of half as many values (two bf16 a float); its rows filled by the threads where `par`. `narrow`: the
    narrow-window copy (ds_conv_amx_narrow_pad: pixels of Cp channels, rows (OW rounded up to 16 - 1) x SW + KW
    pixels wide; `padded_rows` N x ((OH - 1) x SH + KH)). `from_channels`: x's pixels hold that many channels,
    fewer than geo_buf's C (padded_fits: the rest zero in the copy)."""
    r, kind = kir.Var("pr"), "_narrow" if narrow else ""
    count = (kir.Call(f"ds_conv_amx{kind}_padded", (kir.Addr(geo_buf), n), I64) + 1) / 2
    fill = kir.call_void(f"ds_conv_amx{kind}_pad", kir.Addr(geo_buf), n, kir.Addr(x), kir.Addr(xp), r, r + 1) \
        if from_channels is None else \
        kir.call_void("ds_conv_amx_pad_from", kir.Addr(geo_buf), n, kir.Addr(x), kir.Addr(xp), r, r + 1,
                      kir.Const(from_channels, I64))
    return ([kir.Alloc(xp, count), kir.For(r, padded_rows, (fill,), omp=kir.Omp(parallel=True, if_=par))],
            kir.Free(xp))


def tile(geo_buf: kir.Buffer, xp: kir.Buffer, bp: kir.Buffer, o0: kir.Buffer, v0: kir.Expr, v1: kir.Expr,
         q: kir.Expr, bias: kir.Expr, res: kir.Expr) -> kir.Eval:
    """Virtual rows v0..v1 times panels q and q + 1, finished (ds_conv_amx_tile2)."""
    return kir.call_void("ds_conv_amx_tile2", kir.Addr(geo_buf), kir.Addr(xp), kir.Addr(bp), kir.Addr(o0), v0, v1, q,
                         bias, res)


def narrow_rows(geo_buf: kir.Buffer, n: kir.Expr) -> kir.Expr:
    """The narrow-window tiles' virtual rows of n images (ds_conv_amx_narrow_rows: a row's OW rounded up to 16)."""
    return kir.Call("ds_conv_amx_narrow_rows", (kir.Addr(geo_buf), n), I64)


def narrow_tile(geo_buf: kir.Buffer, xp: kir.Buffer, bn: kir.Buffer, o0: kir.Buffer, v0: kir.Expr, v1: kir.Expr,
                q: kir.Expr, bias: kir.Expr, res: kir.Expr) -> kir.Eval:
    """Virtual rows v0..v1 times panels q and q + 1 of the narrow weights bn, finished (ds_conv_amx_narrow_tile2)."""
    return kir.call_void("ds_conv_amx_narrow_tile2", kir.Addr(geo_buf), kir.Addr(xp), kir.Addr(bn), kir.Addr(o0), v0,
                         v1, q, bias, res)
