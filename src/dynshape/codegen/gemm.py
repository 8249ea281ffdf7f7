"""MatMul / Gemm through the chosen BLAS (MKL when installed, else numpy's OpenBLAS), called from C.

numpy's matmul picks its own path per call (and leaves BLAS for stacked or strided operands); here every
float32 product is one `ds_sgemm` or one strided-batched call writing straight into its output buffer
(csrc/ds_matmul.c, with the BLAS shim csrc/ds_blas.h).
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from dataclasses import dataclass

import numpy as np

from dynshape.codegen.blas import bind, resolve
from dynshape.codegen.clib import F32, I64, INT, P, declare
from dynshape.codegen.keep import Keep
from dynshape.codegen.lowering import BindRequest, NativeCall, NativeRule, register_lowering
from dynshape.ir.graph import Graph, Node
from dynshape.passes.values import is_float32

_SIGNATURES = {"ds_matmul_f32": (P, P, P, I64, I64, I64, I64, I64, I64, INT, INT, F32, F32),
               "ds_matmul_packed": (P, P), "ds_bind_blas": (P, P), "ds_bind_blas_threads": (P, P)}
# one library per BLAS: each loaded copy holds its own function pointers (ds_bind_blas), so executables compiled
# with different `blas` options can live in one process
LIBRARIES = {name: declare(f"gemm_{name}", "ds_matmul.c", _SIGNATURES, openmp=True, flags=(f"-DDS_BLAS_{name}",))
             for name in ("mkl", "openblas")}


@dataclass(frozen=True)
class Matmul:
    """The bound product entry points of one BLAS choice."""

    fn: ctypes._CFuncPtr  # ds_matmul_f32(a, b, c, batch, m, n, k, sa, sb, ta, tb, alpha, beta)
    packed: ctypes._CFuncPtr  # ds_matmul_packed(int64 args[11], float args[2])
    blas: str


_bound: dict[str, Matmul | None] = {}
_lock = threading.Lock()


def kernel(choice: str = "auto") -> Matmul | None:
    """The product entry points bound to the BLAS `choice` (auto, mkl, openblas); None without a compiler or
    a usable BLAS (callers then take numpy's matmul)."""
    with _lock:
        if choice not in _bound:
            try:
                blas = resolve(choice)
                lib = LIBRARIES[blas.name].load()
                bind(lib, blas)
                if blas.name == "openblas":  # its own threads: split the products over the OpenMP team instead
                    lib.ds_bind_blas_threads(*blas.thread_knobs())
                _bound[choice] = Matmul(lib.ds_matmul_f32, lib.ds_matmul_packed, blas.name)
            except Exception:  # noqa: BLE001 - no compiler or no usable BLAS: numpy's matmul instead
                _bound[choice] = None
        return _bound[choice]


def packed_call(mm: Matmul, a: int, b: int, c: int, batch: int, m: int, n: int, k: int, sa: int, sb: int, ta: int,
                tb: int, alpha: float, beta: float, keep: Keep) -> NativeCall:
    """One pre-bound product (addresses fixed): a native call a plan's program can run."""
    ints = keep.table([a, b, c, batch, m, n, k, sa, sb, ta, tb])
    return NativeCall(mm.packed, (ints, keep.table([alpha, beta], np.float32)))


def blas_name(choice: str = "auto") -> str:
    mm = kernel(choice)
    return mm.blas if mm is not None else "numpy"


def batch_layout(a_shape: tuple, b_shape: tuple) -> tuple | None:
    """(batch, m, n, k, sa, sb) that runs a @ b (numpy broadcasting) as strided GEMMs, or None when the batch
    dims broadcast in a way one element stride cannot express."""
    if len(a_shape) < 2 or len(b_shape) < 2 or b_shape[-2] != a_shape[-1]:
        return None
    k, n = a_shape[-1], b_shape[-1]
    if len(b_shape) == 2:  # every row of a against one matrix: a single GEMM
        return 1, math.prod(a_shape[:-1]), n, k, 0, 0
    m = a_shape[-2]
    if a_shape[:-2] == b_shape[:-2]:
        return math.prod(a_shape[:-2]), m, n, k, m * k, k * n
    if len(a_shape) == 2:
        return math.prod(b_shape[:-2]), m, n, k, 0, k * n
    return None


def matmul(a: np.ndarray, b: np.ndarray, choice: str = "auto") -> np.ndarray | None:
    """a @ b for float32 with numpy's broadcasting of batch dims (None: not covered, caller falls back)."""
    mm = kernel(choice)
    if mm is None or a.dtype != np.float32 or b.dtype != np.float32:
        return None
    layout = batch_layout(a.shape, b.shape)
    if layout is None:
        return None
    batch, m, n, k, sa, sb = layout
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    c = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], n), np.float32)
    mm.fn(a.ctypes.data, b.ctypes.data, c.ctypes.data, batch, m, n, k, sa, sb, 0, 0, 1.0, 0.0)
    return c


def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray | None, alpha: float, beta: float, ta: int, tb: int,
         choice: str = "auto") -> np.ndarray | None:
    """ONNX Gemm: alpha * op(a) @ op(b) + beta * c, c broadcast to (m, n)."""
    mm = kernel(choice)
    if mm is None or a.dtype != np.float32 or b.dtype != np.float32 or a.ndim != 2 or b.ndim != 2:
        return None
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    n = b.shape[0] if tb else b.shape[1]
    if (b.shape[1] if tb else b.shape[0]) != k:
        return None
    if c is None or beta == 0.0:
        y = np.empty((m, n), np.float32)
        beta = 0.0
    else:
        y = np.empty((m, n), np.float32)
        y[...] = c  # broadcast the bias into the output, then accumulate onto it
    mm.fn(a.ctypes.data, b.ctypes.data, y.ctypes.data, 1, m, n, k, 0, 0, ta, tb, alpha, beta)
    return y


# ---- native lowerings: MatMul / Gemm bound to a plan's buffers ------------------------------------------
def _float32_node(node: Node, graph: Graph) -> str | None:
    for x in (*node.inputs, *node.outputs):
        if x and not is_float32(graph.types.get(x)):
            return f"{x!r} is not float32 (the BLAS path is sgemm)"
    return None


def _bind_matmul(r: BindRequest) -> list | None:
    a, b = r.ins
    mm, layout = kernel(r.options.blas), batch_layout(a.shape, b.shape)
    if mm is None or layout is None:
        return None
    batch, m, n, k, sa, sb = layout
    return [packed_call(mm, r.addr(a), r.addr(b), r.addr(r.outs[0]), batch, m, n, k, sa, sb, 0, 0, 1.0, 0.0,
                        r.keep)]


def _gemm_accepts(node: Node, graph: Graph) -> str | None:
    for x in node.inputs[:2]:
        t = graph.types.get(x)
        if getattr(t, "shape", None) is None or len(t.shape) != 2:
            return "Gemm operands that are not matrices"
    return _float32_node(node, graph)


def _bind_gemm(r: BindRequest) -> list | None:
    mm = kernel(r.options.blas)
    a, b = r.ins[0], r.ins[1]
    bias = r.ins[2] if len(r.ins) > 2 else None
    c = r.outs[0]
    if mm is None:
        return None
    ta, tb = bool(r.attrs.get("transA", 0)), bool(r.attrs.get("transB", 0))
    alpha, beta = float(r.attrs.get("alpha", 1.0)), float(r.attrs.get("beta", 1.0))
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    n = c.shape[1]
    calls: list = []
    if bias is None or beta == 0.0:
        beta = 0.0
    else:
        calls.append(functools.partial(np.copyto, c, np.broadcast_to(bias, c.shape)))
    calls.append(packed_call(mm, r.addr(a), r.addr(b), r.addr(c), 1, m, n, k, 0, 0, int(ta), int(tb), alpha, beta,
                             r.keep))
    return calls


register_lowering("MatMul", "native", NativeRule(_float32_node, _bind_matmul))
register_lowering("Gemm", "native", NativeRule(_gemm_accepts, _bind_gemm))
