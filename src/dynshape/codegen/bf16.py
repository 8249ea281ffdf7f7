"""bfloat16 products (`Options.precision`): the rounding, the packed weights and the C library (csrc/ds_gemm_bf16.c).

Why bf16 at all: on CPUs with AVX512-BF16 (AMD Zen 4, Intel Cooper Lake and Sapphire Rapids) one VDPBF16PS does
twice the multiply-adds of a float32 FMA and the weights stream half the bytes; OpenVINO runs bf16 by default
there. dynshape keeps float32 as its default (exactness is the promise) and makes bf16 an option: the products by
constant weights (MatMul / Gemm by an initializer, what dominates transformers and MLPs) take bf16 operands with
float32 accumulation, and so do attention's two products (Q @ K^T, the softmax's exps @ V). Epilogues, softmax,
normalisations and every other op compute in float32, and graph inputs and outputs stay float32; where a result is
rounded to bf16 next or carries bf16's error already, a few compute to that need rather than to float32's last bit
(a product epilogue's erf, the attention softmax's exps, a fused layer norm's sums: epilogue_math, softmax_exp_sum,
layernorm_row below).

- "bf16": the native kernels; refused at compile time on a CPU (or a compiler) without AVX512-BF16.
- "bf16-emulated": the same rounding of both operands (nearest even, denormals to zero), multiplied on the float32
  micro-kernels (exact: a product of two bf16 fits in float32's mantissa), on any CPU. The tests check the native
  kernels against it, so a machine without the instructions still checks the rounding and the layouts.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from dynshape.codegen import cshared, packed_gemm
from dynshape.codegen.clib import I64, CLibrary, P, declare
from dynshape.errors import DynshapeError
from dynshape.options import Options

BF16_PRECISIONS = ("bf16", "bf16-emulated")
PAIR_COLUMNS = 64  # bf16 values in one row of a packed panel: 32 columns x a pair of consecutive k

LIBRARY = declare("packed_gemm_bf16", "ds_gemm_bf16.c", {
    "ds_bf16_native": (), "ds_bf16_use_amx": (ctypes.c_int,), "ds_amx_configure_other": (ctypes.c_int,),
    "ds_bf16_epoch": (), "ds_round_bf16": (P, I64, P),
    "ds_gemm_block_bf16": (P, I64, P, P, I64, I64, I64, I64, I64, I64, I64),
    "ds_gemm_panel_bf16": (P, I64, P, P, I64, I64, I64, I64, I64, I64),
    "ds_gemm_block_bf16e": (P, I64, P, P, I64, I64, I64, I64, I64, I64, I64),
    "ds_gemm_panel_bf16e": (P, I64, P, P, I64, I64, I64, I64, I64, I64),
    "ds_pack_panels_bf16": (P, I64, I64, I64, P), "ds_pack_panels_t_bf16": (P, I64, I64, I64, P),
    "ds_pack_panels_bf16_ref": (P, I64, I64, I64, P), "ds_pack_panels_t_bf16_ref": (P, I64, I64, I64, P),
    "ds_pack_panels_bf16e": (P, I64, I64, I64, P), "ds_pack_panels_t_bf16e": (P, I64, I64, I64, P),
    "ds_conv_tile2_bf16": (P, P, P, P, P, I64, I64, I64, I64, P, P, I64),
    "ds_conv_tile2_bf16e": (P, P, P, P, P, I64, I64, I64, I64, P, P, I64),
    "ds_conv_tile2_bf16_pre": (P, P, P, P, P, I64, I64, I64, I64, P, P, I64, P, P, I64),
    "ds_conv_tile2_bf16e_pre": (P, P, P, P, P, I64, I64, I64, I64, P, P, I64, P, P, I64),
    "ds_conv_tile2_bf16_addr": (), "ds_conv_tile2_bf16e_addr": ()},
    share=True, needs=(packed_gemm.LIBRARY,),
    restypes={"ds_bf16_native": ctypes.c_int, "ds_bf16_use_amx": ctypes.c_int, "ds_amx_configure_other": ctypes.c_int,
              "ds_bf16_epoch": I64,
              "ds_conv_tile2_bf16_addr": I64, "ds_conv_tile2_bf16e_addr": I64})


def round_bf16(x: np.ndarray) -> np.ndarray:
    """x (float32) rounded to bfloat16, as uint16 bits: nearest even, a denormal to a signed zero, a NaN kept
    quiet: what VCVTNE2PS2BF16 does (and ds_to_bf16 in csrc/ds_gemm_bf16.c)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    sign = ((u >> 16) & 0x8000).astype(np.uint16)
    nan = ((u >> 16) | 0x40).astype(np.uint16)
    exp = u & 0x7F800000
    out = np.where(exp == 0, sign, rounded)
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, nan, out).astype(np.uint16)


def bf16_to_f32(h: np.ndarray) -> np.ndarray:
    """bf16 bits as the float32 values they stand for."""
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def rounded(x: np.ndarray) -> np.ndarray:
    """x with every value replaced by its bf16 rounding (float32)."""
    return bf16_to_f32(round_bf16(x)).reshape(np.shape(x))


def pack_b_bf16(b: np.ndarray, trans: bool = False) -> np.ndarray:
    """B (k, n) (or (n, k) with trans) rounded to bf16 as panels [ceil(n / 32), ceil(k / 2), 64] of uint16: row p of
    panel q holds (B[2p][j], B[2p + 1][j]) for the panel's columns j, zero past n and past k (what
    ds_gemm_block_bf16 reads): pack_b's float32 panels, in pairs."""
    return pairs_of(packed_gemm.pack_b(b, trans))


def pack_b_rounded(b: np.ndarray, trans: bool = False) -> np.ndarray:
    """The float32 panels of pack_b, of B's values rounded to bf16 (what the emulated kernels read)."""
    return packed_gemm.pack_b(rounded(np.asarray(b, dtype=np.float32)), trans)


def pairs_of(f: np.ndarray) -> np.ndarray:
    """Float32 panels [..., K, 32] (pack_conv's, pack_winograd's) rounded to bf16 with their rows taken in pairs:
    [..., ceil(K / 2), 64], row p holding (f[2p][j], f[2p + 1][j]) per column j (what ds_conv_tile2_bf16 reads)."""
    lead = f.shape[:-2]
    f = f.reshape(-1, *f.shape[-2:])
    gp, k, nr = f.shape
    k2 = -(-k // 2)
    bits = np.zeros((gp, 2 * k2, nr), np.uint16)
    bits[:, :k] = round_bf16(f).reshape(f.shape)
    out = packed_gemm.aligned((*lead, k2, PAIR_COLUMNS), np.uint16)
    out.reshape(gp, k2, PAIR_COLUMNS)[...] = bits.reshape(gp, k2, 2, nr).transpose(0, 1, 3, 2).reshape(
        gp, k2, PAIR_COLUMNS)
    return out


def narrow_channels(c: int) -> int:
    """The channels of a pixel in a narrow conv's padded copy (ds_shared.h's DS_NARROW_CP): C rounded up to 2, 4 or
    8, so a window row's KW x Cp values come in whole bf16 pairs and 16 / Cp pixels fill a vector; None past 8."""
    return next((n for n in cshared.NARROW_PIXEL_CHANNELS if c <= n), None)


def padded_channels(c: int) -> int:
    """c rounded up to a multiple of 16: the channels of a direct AMX conv's padded copy (conv_amx.padded_fits)."""
    return -(-c // 16) * 16


def channels_padded(w: np.ndarray) -> np.ndarray:
    """A conv's weights (Co, C, *kernel) with zero input channels added up to padded_channels(C): what a direct AMX
    conv reads from a padded copy of its input whose pixels hold that many channels (conv_amx.padded_fits)."""
    w = np.asarray(w, dtype=np.float32)
    cp = padded_channels(w.shape[1])
    out = np.zeros((w.shape[0], cp, *w.shape[2:]), np.float32)
    out[:, :w.shape[1]] = w
    return out


def pack_conv_narrow(w: np.ndarray) -> np.ndarray:
    """A conv's weights (Co, C, KH, KW) (or (Co, C, KW): 1-D, one tap row), C <= 8, as the narrow-window tiles
    read them (csrc/ds_conv_amx.c's ds_conv_amx_narrow_tile2): per panel of 32 outputs and tap row kh, the window
    row's k = kw * Cp + c (Cp: C rounded up to 2, 4 or 8; the channels past C zero, as the padded copy's) padded
    to 32 and taken in pairs: uint16 [ceil(Co / 32), KH, 16, 64]."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim == 3:
        w = w[:, :, None, :]
    co, c, kh, kw = w.shape
    cp = narrow_channels(c)
    if cp is None or kw * cp > cshared.NARROW_ROW:
        raise ValueError(f"a narrow conv's window row holds at most {cshared.NARROW_ROW} values of at most "
                         f"{cshared.NARROW_PIXEL_CHANNELS[-1]} channels, not {kw} x {c}")
    nr = packed_gemm.NR
    panels = -(-co // nr)
    f = np.zeros((kh, kw, cp, panels * nr), np.float32)
    f[:, :, :c, :co] = w.transpose(2, 3, 1, 0)
    rows = np.zeros((kh, cshared.NARROW_ROW, panels, nr), np.float32)
    rows[:, :kw * cp] = f.reshape(kh, kw * cp, panels, nr)
    return pairs_of(np.ascontiguousarray(rows.transpose(2, 0, 1, 3)))


packed_gemm.PACKERS["bf16"] = lambda w, trans, groups: pack_b_bf16(w, trans)
packed_gemm.PACKERS["bf16e"] = lambda w, trans, groups: pack_b_rounded(w, trans)
packed_gemm.PACKERS["conv_bf16"] = lambda w, trans, groups: pairs_of(packed_gemm.pack_conv(w, groups))
packed_gemm.PACKERS["conv_bf16e"] = lambda w, trans, groups: rounded(packed_gemm.pack_conv(w, groups))
packed_gemm.PACKERS["conv_narrow_bf16"] = lambda w, trans, groups: pack_conv_narrow(w)
packed_gemm.PACKERS["conv_bf16_cpad"] = lambda w, trans, groups: pairs_of(packed_gemm.pack_conv(channels_padded(w), 1))
packed_gemm.PACKERS["deconv_bf16"] = lambda w, trans, groups: pairs_of(packed_gemm.pack_deconv(w))
packed_gemm.PACKERS["deconv_bf16e"] = lambda w, trans, groups: rounded(packed_gemm.pack_deconv(w))
for _m, _name in ((2, "winograd"), (4, "winograd4")):  # Winograd's transformed weights, per position
    packed_gemm.PACKERS[_name + "_bf16"] = lambda w, trans, groups, m=_m: pairs_of(packed_gemm.pack_winograd(w, m))
    packed_gemm.PACKERS[_name + "_bf16e"] = lambda w, trans, groups, m=_m: rounded(packed_gemm.pack_winograd(w, m))


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        line = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        return frozenset()
    return frozenset(line.split(":", 1)[1].split())


def native_in(flag: str, library: CLibrary, probe: str) -> bool:
    """Whether this CPU has `flag` (a /proc/cpuinfo flag) and `library` was compiled with its instructions (gcc
    -march=native): its entry point `probe` returns nonzero."""
    if flag not in cpu_flags():
        return False
    lib = library.try_load()
    return bool(lib is not None and getattr(lib, probe)())


@functools.cache
def native_available() -> bool:
    """Whether this CPU has AVX512-BF16 and the library was compiled with it."""
    return native_in("avx512_bf16", LIBRARY, "ds_bf16_native")


def check_precision(options: Options) -> None:
    """Refuse precision="bf16" where it cannot run natively, before anything is built."""
    if options.precision == "bf16" and not native_available():
        have = sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))
        raise DynshapeError(
            "precision='bf16' needs a CPU with AVX512-BF16 (AMD Zen 4 and later, Intel Cooper Lake, Sapphire Rapids "
            f"and later) and a compiler that targets it; this one has {', '.join(have) or 'no AVX-512'}. Use "
            "precision='fp32', or precision='bf16-emulated' for the same rounding on the float32 kernels (slow)")


def active(options: Options) -> bool:
    """Whether products run in bf16 under `options` (precision "bf16" or "bf16-emulated"; "int8" is not bf16)."""
    return options.precision in BF16_PRECISIONS


def layout_of(options: Options) -> str | None:
    """The packed-weight layout of products under `options` (None: float32 panels)."""
    return {"bf16": "bf16", "bf16-emulated": "bf16e"}.get(options.precision)


def product_calls(options: Options) -> tuple[str, str]:
    """The tile and panel entry points (csrc/ds_gemm_bf16.h) that products call under `options`."""
    suffix = "e" if options.precision == "bf16-emulated" else ""
    return f"ds_gemm_block_bf16{suffix}", f"ds_gemm_panel_bf16{suffix}"


def attention_calls(options: Options) -> tuple[str, str, str]:
    """Attention's packers (K as stored, K transposed) and tile product under `options`, with the epoch argument."""
    if not active(options):
        return "ds_pack_panels", "ds_pack_panels_t", "ds_gemm_tile"
    suffix = "e" if options.precision == "bf16-emulated" else ""
    return f"ds_pack_panels_bf16{suffix}", f"ds_pack_panels_t_bf16{suffix}", f"ds_gemm_block_bf16{suffix}"


def winograd_tile(options: Options) -> tuple[str, int]:
    """The address getter of the tile Winograd's products call under a bf16 precision, and whether its weights are
    bf16 pairs (1) or rounded float32 panels (0)."""
    if options.precision == "bf16-emulated":
        return "ds_conv_tile2_bf16e_addr", 0
    return "ds_conv_tile2_bf16_addr", 1


def conv_call(options: Options) -> str:
    """The convolution tile (two panels) that implicit-GEMM convolutions call under a bf16 precision."""
    return "ds_conv_tile2_bf16e" if options.precision == "bf16-emulated" else "ds_conv_tile2_bf16"


def epilogue_math(options: Options) -> dict[str, str]:
    """The math functions a product's epilogue swaps under `options` (lower/elementwise.emit_nodes' `fns`): under a
    bf16 precision erf is ds_erff_bf16 (csrc/ds_prelude.h: absolute error < 2e-6, half the work of ds_erff), as the
    value it takes carries the bf16 operands' rounding (2^-9 relative) and the next product rounds its result to
    bf16 again; float32 keeps ds_erff. Emulated and native bf16 swap alike, so they still compute the same."""
    return {"ds_erff": "ds_erff_bf16"} if active(options) else {}


def softmax_exp_sum(options: Options) -> str:
    """The attention softmax's exp-and-sum pass under `options` (lower/softmax.softmax_passes' `exp_sum`): under a
    bf16 precision, whose product by V rounds every exp to bf16 (2^-9 relative), ds_softmax_exp_sum_bf16 (exps
    within 4e-6, 9 vector operations where float32's take 14); emulated and native alike."""
    return "ds_softmax_exp_sum_bf16" if active(options) else "ds_softmax_exp_sum"


def layernorm_row(options: Options) -> str:
    """The row normalisation a product's fused LayerNormalization calls under `options`: under a bf16 precision
    ds_layernorm_row_tree (csrc/ds_gemm.c: its sums tree-added, 2x faster, float32 results a few ulp from
    ds_layernorm_row's); float32 keeps ds_layernorm_row, bit for bit."""
    return "ds_layernorm_row_tree" if active(options) else "ds_layernorm_row"


def amx_tiles(options: Options) -> bool:
    """Whether bf16 products under `options` run on AMX tiles here (csrc/ds_gemm_bf16.c: precision "bf16", a
    library compiled with AMX-BF16, and Linux granted the tiles' state), calls under 4 rows on VDPBF16PS."""
    return options.precision == "bf16" and native_available() and bool(LIBRARY.load().ds_bf16_use_amx(-1))


def method(options: Options) -> str:
    """How a bf16 product computes, for explain."""
    how = ("AMX TDPBF16PS tiles, VDPBF16PS under 4 rows" if amx_tiles(options) else "VDPBF16PS"
           if options.precision == "bf16" else "emulated: rounded operands on the float32 kernels")
    return f"bf16 operands, float32 accumulation and epilogue ({how})"
