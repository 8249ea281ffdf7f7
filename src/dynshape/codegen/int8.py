"""int8 products (`dynshape::DynamicQuantizeMatMul`, passes/quant.py; `dynshape::QuantizedMatMul`, passes/qdq.py):
the packed weights and the C library (csrc/ds_gemm_int8.c).

Why: a model quantized dynamically (onnxruntime's `quantize_dynamic`, the recommended way for transformers) stores
its MatMul weights as int8 and quantizes each activation to uint8 per call; run node by node that is five passes
over memory per product and an int32 matrix in between. One kernel instead quantizes the activation once, multiplies
u8 x s8 with int32 accumulation (VPDPBUSD on AVX512-VNNI: four multiply-adds per byte lane, four times a float32
FMA's), and applies the zero-point corrections, the scales and the float epilogue while a tile is in cache. The
result is the graph's exactly (integer arithmetic, then the same float32 roundings), so it is no opt-in precision:
every build of such a model gets it.

Weights: W (k, n) int8, or uint8 shifted by -128 into int8 with its zero points (w - zp = (w - 128) - (zp - 128)),
packed into panels [ceil(n / 32), ceil(k / 4), 32, 4] (groups of 4 consecutive k per column, zeros past k and n),
then the int32 column sums of the packed values, one per padded column.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from dynshape.codegen import packed_gemm
from dynshape.codegen.bf16 import native_in
from dynshape.codegen.clib import F32, I64, INT, P, declare
from dynshape.codegen.library import register_helper

NR = packed_gemm.NR  # columns per panel, as the float products
GROUP = 4  # consecutive k per column that one VPDPBUSD lane sums

LIBRARY = declare("packed_gemm_int8", "ds_gemm_int8.c", {
    "ds_q8_native": (), "ds_q8_avx2": (), "ds_q8_use_amx": (ctypes.c_int,), "ds_q8_params": (F32, F32, P, P),
    "ds_q8_quantize": (P, I64, I64),
    "ds_q8_act_params": (P, P, P), "ds_q8_act_row": (P, I64, P, P),
    "ds_q8_block": (P, P, P, I64, I64, I64, I64, I64, I64, P, P),
    "ds_q8_block_e": (P, P, P, I64, I64, I64, I64, I64, I64, P, P),
    "ds_q8_block_avx2": (P, P, P, I64, I64, I64, I64, I64, I64, P, P),
    "ds_q8_quantize_static": (P, I64, I64, F32, INT, INT), "ds_q8_load": (P, I64, I64, INT, INT),
    "ds_q8_quantize_tokens": (P, I64, I64),
    "ds_q8_block_rq": (P, P, P, I64, I64, I64, I64, I64, I64, P, P, INT, INT),
    "ds_q8_block_rq_e": (P, P, P, I64, I64, I64, I64, I64, I64, P, P, INT, INT),
    "ds_q8_block_rq_avx2": (P, P, P, I64, I64, I64, I64, I64, I64, P, P, INT, INT)},
    openmp=True, share=True, restypes={"ds_q8_native": ctypes.c_int, "ds_q8_avx2": ctypes.c_int,
                                       "ds_q8_use_amx": ctypes.c_int,
                                       "ds_q8_quantize": ctypes.c_void_p, "ds_q8_quantize_static": ctypes.c_void_p,
                                       "ds_q8_load": ctypes.c_void_p, "ds_q8_quantize_tokens": ctypes.c_void_p})

register_helper("packed_gemm_int8", LIBRARY, "ds_gemm_int8.h")


def pack_q8(w: np.ndarray) -> np.ndarray:
    """W (k, n) int8 as what ds_q8_block reads: panels [ceil(n / 32), ceil(k / 4), 32, 4] of int8, then
    ceil(n / 32) * 32 int32 column sums; one 64-byte aligned uint8 array."""
    w = np.asarray(w, dtype=np.int8)
    k, n = w.shape
    panels, k4 = -(-n // NR), -(-k // GROUP)
    padded = np.zeros((k4 * GROUP, panels * NR), np.int8)
    padded[:k, :n] = w
    body = panels * k4 * NR * GROUP
    out = packed_gemm.aligned(body + panels * NR * 4, np.uint8)
    # (k4, 4, panels, 32) -> (panels, k4, 32, 4)
    out[:body].view(np.int8)[...] = padded.reshape(k4, GROUP, panels, NR).transpose(2, 0, 3, 1).reshape(-1)
    out[body:].view(np.int32)[...] = padded.astype(np.int32).sum(axis=0)
    return out


packed_gemm.PACKERS["q8"] = lambda w, trans, groups: pack_q8(w.T if trans else w)


@functools.cache
def native_available() -> bool:
    """Whether the int8 tiles run VPDPBUSD here: the CPU has AVX512-VNNI and the library was compiled for it."""
    return native_in("avx512_vnni", LIBRARY, "ds_q8_native")


@functools.cache
def avx2_tiles() -> bool:
    """Whether the library has the exact AVX2 tiles (VPMADDWD on bytes widened to int16: `ds_q8_block_avx2`); they
    run where VNNI is absent, and are testable wherever they are compiled."""
    lib = LIBRARY.try_load()
    return lib is not None and bool(lib.ds_q8_avx2())


def amx_tiles() -> bool:
    """Whether the int8 tiles run on AMX here (TDPBUSD, csrc/ds_gemm_int8.c; the rows under 16 on VPDPBUSD)."""
    return native_available() and bool(LIBRARY.load().ds_q8_use_amx(-1))


def method() -> str:
    """How the int8 products compute here, for explain."""
    if native_available():
        how = "AMX TDPBUSD tiles, VPDPBUSD under 16 rows" if amx_tiles() else "VPDPBUSD"
    else:
        how = "AVX2 VPMADDWD on bytes widened to int16" if avx2_tiles() else "portable int32 C"
    return f"uint8 x int8 products, int32 accumulation ({how}), float32 scales and epilogue"
