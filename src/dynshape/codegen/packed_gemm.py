"""Our own sgemm for products with a constant right operand (weights), with the epilogue fused in.

Why our own: the weights are known at compile time, so they are packed once into 32-column panels
(`pack_b`), and a register-blocked micro-kernel streams them without the per-call packing a BLAS does. It
matched MKL and beat OpenBLAS here (bench/gemm_bench.py --packed: 130-157 GFLOP/s on one AVX-512 core at
M = 7..4096), so the fast path no longer depends on which BLAS is installed.  And because the product is
ours, the elementwise group that consumes it (bias, ReLU, GELU, residual add) runs on each block of rows
while it is still in cache, instead of another pass over memory.

The C (csrc/ds_gemm.c) is plain C with GCC vector extensions (no intrinsics): 16-float vectors become one zmm
register with AVX-512, two ymm with AVX2, four xmm elsewhere.  It is one shared library (`library()`, loaded with
its symbols global, compiled once per machine); a fused kernel includes "ds_gemm.h" and calls
    ds_gemm_block(a, lda, bp, c, ldc, i0, i1, q, n, k)
for the tile (rows i0..i1, panel q) of C = A @ B, then applies its epilogue to that tile while it is in cache
(`ds_gemm_tile`, same arguments, for callers whose i0 is relative to their own pointers: it never prefetches).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dynshape.codegen import cshared
from dynshape.codegen.clib import F32, I64, P, declare
from dynshape.ir.buffers import OWN_PAGES_BYTES, fresh_array

NR = cshared.NR  # columns per packed panel: two 16-float vectors (DS_NR)
ROW_BLOCK = 60  # rows per block (a multiple of every micro-tile height): the block stays in cache for the epilogue
ROW_TAIL = 12  # a last block of up to this many rows joins the one before it
MR_WIDE = 12  # rows per micro-tile with 32 vector registers (AVX-512): 24 accumulators; 12 measured 6-10% over 8
MR_NARROW = 4  # with 16 registers
PAR_MIN_FLOPS = 1 << 20  # multiply-adds below which a product runs on one thread


def aligned(shape: int | tuple, dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array starting on a 64-byte boundary. Packed weights live in these: numpy's
    own allocations start 16 bytes past one, so every 64-byte vector load of a panel touched two cache lines
    (a 256-channel 3x3 conv tile sweep: 192 -> 181 GFLOP/s with the panels 16 bytes off). Large ones are
    ir/buffers' page-aligned mappings (numpy's own large arrays may stall in THP compaction: VGG-19's 550 MB of
    packed weights took 0.94-1.44 s instead of 0.37 s to pack; the kernels ran at the same speed)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if n >= OWN_PAGES_BYTES:
        return fresh_array(shape, dtype)
    buf = np.empty(n + 64, np.uint8)
    off = -buf.ctypes.data % 64
    return buf[off:off + n].view(dtype).reshape(shape)


def pack_b(b: np.ndarray, trans: bool = False) -> np.ndarray:
    """B (k, n) (or (n, k) with trans) as panels [ceil(n/32), k, 32] of float32, zero-padded on the right.

    In C when the micro-kernel library loads (one pass; a transposed VGG classifier, 25088 x 4096, packs in
    ~0.1 s instead of ~1 s through numpy's strided copies), else with numpy."""
    b = np.asarray(b, dtype=np.float32)
    lib = LIBRARY.try_load() if b.ndim == 2 and b.size >= 1 << 16 else None
    if lib is not None:
        src = np.ascontiguousarray(b)
        k, n = (src.shape[1], src.shape[0]) if trans else src.shape
        out = aligned((-(-n // NR), k, NR))
        (lib.ds_pack_panels_t if trans else lib.ds_pack_panels)(src.ctypes.data, src.shape[1], k, n, out.ctypes.data)
        return out
    if trans:
        b = b.T
    k, n = b.shape
    panels = -(-n // NR)
    padded = np.zeros((k, panels * NR), np.float32)
    padded[:, :n] = b
    out = aligned((panels, k, NR))
    out[...] = padded.reshape(k, panels, NR).transpose(1, 0, 2)
    return out


def pack_conv(w: np.ndarray, groups: int, scale: np.ndarray | None = None) -> np.ndarray:
    """A convolution's weights (Co, Ci / groups, KH, KW) (or (Co, Ci / groups, KW): 1-D), each output channel
    times `scale` (Co floats) when given, as, per group, panels [ceil(Co_g / 32), KH * KW * Ci_g, 32] whose rows
    run over k = (kh * KW + kw) * Ci_g + c: the layout ds_conv_tile reads (csrc/ds_conv.h). Groups follow each
    other. In C when the micro-kernel library loads: one pass from the weights as stored, not a transposed copy
    and then a pack (ResNet-50's 1x1 and strided convs, 48 MB: 67 -> 45 ms). `scale` lets a caller fold a
    per-channel factor (an inference BatchNorm) into the pack itself; passes/fold.py still folds its own copy."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim == 3:
        w = w[:, :, None, :]
    co, cig, kh, kw = w.shape
    cog = co // groups
    panels = -(-cog // NR)
    lib = LIBRARY.try_load() if w.size >= 1 << 12 else None
    if lib is not None:
        src = np.ascontiguousarray(w)
        sc = None if scale is None else np.ascontiguousarray(scale, dtype=np.float32)
        out = aligned((groups * panels, kh * kw * cig, NR))
        lib.ds_pack_conv(src.ctypes.data, co, cig, kh * kw, groups, None if sc is None else sc.ctypes.data,
                         out.ctypes.data)
        return out
    if scale is not None:
        w = w * np.asarray(scale, dtype=np.float32).reshape(-1, 1, 1, 1)
    # per group (cog, kh * kw * cig) rows, packed transposed
    mats = [np.ascontiguousarray(w[g * cog:(g + 1) * cog].transpose(0, 2, 3, 1)).reshape(cog, kh * kw * cig)
            for g in range(groups)]
    out = aligned((groups * panels, kh * kw * cig, NR))
    np.concatenate([pack_b(m, trans=True) for m in mats], out=out)
    return out


def pack_deconv(w: np.ndarray) -> np.ndarray:
    """A ConvTranspose's weights (Ci, Co, KH, KW) as one (Ci, KH * KW * Co) matrix in 32-column panels: column
    (kh * KW + kw) * Co + co holds the weights of output channel co at tap (kh, kw)."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim == 3:
        w = w[:, :, None, :]
    return pack_b(w.transpose(0, 2, 3, 1).reshape(w.shape[0], -1))


def pack_taps(w: np.ndarray) -> np.ndarray:
    """A depthwise convolution's weights (C, 1, KH, KW) (or (C, 1, KW)) as (KH * KW, C): per tap, the channels
    contiguous, as the channels-last depthwise kernel reads them."""
    w = np.asarray(w, dtype=np.float32)
    t = w.reshape(w.shape[0], -1).T
    out = aligned(t.shape)
    out[...] = t
    return out


#: Winograd's weight transforms G ((tile + 2) x 3): U = G g G^T per (output, input) channel pair, for F(2x2, 3x3)
#: and F(4x4, 3x3) (Lavin and Gray's, interpolation points 0, +-1, +-2 and infinity)
WINOGRAD_G = {2: np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]]),
              4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                           [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])}


def pack_winograd(w: np.ndarray, tile: int = 2) -> np.ndarray:
    """A 3x3 convolution's weights (Co, Ci, 3, 3) transformed for F(tile x tile, 3x3) (in float64, rounded once)
    and packed as (tile + 2)^2 matrices (Ci, Co), one per position of the transformed patch, each in the panels
    of a 1x1 convolution: [(tile + 2)^2, ceil(Co / 32), Ci, 32], what csrc/ds_conv_dw_wino.c's ds_wino_f2 / _f4 read."""
    g = WINOGRAD_G[tile]
    co, ci = w.shape[:2]
    a = g.shape[0]
    lib = LIBRARY.try_load()
    if lib is not None:  # one pass in C (numpy's einsum: 0.16 s for a 512 x 512 layer, on every warm compile)
        src = np.ascontiguousarray(w, dtype=np.float32)
        gd = np.ascontiguousarray(g, dtype=np.float64)
        out = aligned((a * a, -(-co // NR), ci, NR))
        lib.ds_pack_winograd(src.ctypes.data, co, ci, a, gd.ctypes.data, out.ctypes.data)
        return out
    u = np.einsum("ai,ocij,bj->abco", g, np.asarray(w, dtype=np.float64), g).reshape(a * a, ci, co)
    u = u.astype(np.float32)
    parts = [pack_b(u[x]) for x in range(a * a)]
    out = aligned((a * a, *parts[0].shape))
    np.stack(parts, out=out)
    return out


#: packers of further layouts by name, (weight, trans, groups) -> packed (codegen/bf16.py adds its own)
PACKERS: dict[str, Callable[[np.ndarray, bool, int], np.ndarray]] = {}

_packed: dict[tuple, tuple] = {}  # (id(weight), how) -> (weakref to the weight, its packed form)


def packed(w: np.ndarray, trans: bool = False, layout: str = "panels", groups: int = 1) -> np.ndarray:
    """The packed form of a constant (pack_b of it, maybe transposed; pack_conv; pack_taps; pack_deconv),
    computed once per weight array while that array lives (shared by every executable compiled from the same
    graph)."""
    key = (id(w), trans, layout, groups)
    hit = _packed.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1]
    if layout == "conv":
        out = pack_conv(w, groups)
    elif layout == "taps":
        out = pack_taps(w)
    elif layout == "deconv":
        out = pack_deconv(w)
    elif layout == "winograd":
        out = pack_winograd(w, 2)
    elif layout == "winograd4":
        out = pack_winograd(w, 4)
    elif layout in PACKERS:
        out = PACKERS[layout](w, trans, groups)
    else:
        out = pack_b(w, trans)
    try:
        ref = weakref.ref(w, lambda _, key=key: _packed.pop(key, None))
    except TypeError:  # not weak-referenceable: no sharing
        return out
    _packed[key] = (ref, out)
    return out


PARALLEL_PACK_BYTES = 8 << 20  # weights from this total are packed on two threads


def packed_all(items: list[tuple[np.ndarray, bool, str, int]]) -> list[np.ndarray]:
    """`packed(*item)` for each item, on two threads when they are large: the packers run in C without the GIL,
    and what they cost is mostly the first touch of fresh pages (~2 us a page on this VM; ResNet-50's 1x1 and
    strided convs alone are 12,000 pages), which two cores take in parallel. Small C packs below
    DS_PAR_PACK_FLOATS run on one thread each, so the two workers do not oversubscribe the cores."""
    if len(items) < 2 or sum(it[0].nbytes for it in items) < PARALLEL_PACK_BYTES:
        return [packed(*it) for it in items]
    # the largest first, so the two workers end together
    order = sorted(range(len(items)), key=lambda i: -items[i][0].nbytes)
    with ThreadPoolExecutor(2) as pool:
        done = dict(zip(order, pool.map(lambda i: packed(*items[i]), order)))
    return [done[i] for i in range(len(items))]


LIBRARY = declare("packed_gemm", "ds_gemm.c", {
    "ds_pack_panels": (P, I64, I64, I64, P), "ds_pack_panels_t": (P, I64, I64, I64, P),
    "ds_pack_conv": (P, I64, I64, I64, I64, P, P), "ds_pack_winograd": (P, I64, I64, I64, P, P),
    "ds_gemm_panel": (P, I64, P, I64, P, I64, I64, I64, I64, I64),
    "ds_gemm_tile": (P, I64, P, P, I64, I64, I64, I64, I64, I64),
    "ds_gemm_block": (P, I64, P, P, I64, I64, I64, I64, I64, I64),
    "ds_gemm_block_nt": (P, I64, P, P, I64, I64, I64, I64, I64, I64),
    "ds_gemm_packed": (P, I64, P, P, I64, I64, I64, I64),
    "ds_dot_rows": (P, P, I64, I64, P), "ds_axpy_rows": (P, P, I64, I64, P),
    "ds_layernorm_row": (P, P, P, P, I64, F32), "ds_layernorm_row_tree": (P, P, P, P, I64, F32)}, openmp=True,
    share=True,
    flags=(f"-DDS_ROW_BLOCK={ROW_BLOCK}", f"-DDS_PAR_MIN_FLOPS={PAR_MIN_FLOPS}"))


def library():
    """Load the micro-kernel library with its symbols global: kernels that call it must load after this."""
    return LIBRARY.load()
