"""The sgemm that generated C calls, and the libraries that provide it.

Generated code never links against a BLAS: it includes "ds_blas.h" and calls `ds_sgemm` / `ds_sgemm_batched`,
which go through function pointers installed once per loaded library by `bind(lib, blas)`.  So one compiled
kernel works with numpy's bundled OpenBLAS (always present) or MKL (optional extra), the disk-cache key does
not depend on where numpy lives, and a whole graph runs in one C call without returning to Python.

Only ILP64 CBLAS entry points are used (int64 dims), so dynamic sizes never overflow a 32-bit int.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.metadata
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dynshape.errors import DynshapeError
from dynshape.options import mkl_threading_layer

__all__ = ["Blas", "available", "bind", "get", "mkl", "openblas", "resolve"]

# The C side of the contract is csrc/ds_blas.h: ds_sgemm / ds_sgemm_batched through the pointers ds_bind_blas sets.


@dataclass(frozen=True)
class Blas:
    """A loaded BLAS: addresses to hand to generated code plus a thread-count knob."""

    name: str
    path: str
    sgemm: int  # address of an ILP64 cblas_sgemm
    sgemm_strided: int  # address of an ILP64 cblas_sgemm_batch_strided, 0 when absent or unsafe
    _set_threads: Callable[[int], object] = field(repr=False)
    _get_threads: Callable[[], int] = field(repr=False)

    def set_num_threads(self, n: int) -> None:
        """Process-wide thread count of this library's GEMM."""
        self._set_threads(int(n))

    def num_threads(self) -> int:
        return int(self._get_threads())

    def thread_knobs(self) -> tuple[int, int]:
        """The addresses of its set / get thread-count functions (C takes them: csrc/ds_matmul.c)."""
        return (ctypes.cast(self._set_threads, ctypes.c_void_p).value or 0,
                ctypes.cast(self._get_threads, ctypes.c_void_p).value or 0)

    @contextmanager
    def threads(self, n: int) -> Iterator[None]:
        """Run a block with `n` GEMM threads, then restore the previous count (benchmarks)."""
        old = self.num_threads()
        self.set_num_threads(n)
        try:
            yield
        finally:
            self.set_num_threads(old)


def _addr(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0


def _openblas_candidates() -> list[str]:
    """numpy's own OpenBLAS: the scipy_openblas64 package, the wheel's numpy.libs, or whatever is mapped."""
    found: list[str] = []
    try:
        import scipy_openblas64  # type: ignore[import-not-found]

        found += glob.glob(os.path.join(scipy_openblas64.get_lib_dir(), "lib*openblas*.so*"))
    except ImportError:
        pass
    site = Path(np.__file__).parent.parent
    found += sorted(glob.glob(str(site / "numpy.libs" / "lib*openblas64*.so*")))
    try:  # numpy built against a system or conda OpenBLAS: take the one numpy already mapped
        maps = Path("/proc/self/maps").read_text().splitlines()
        found += sorted({ln.split()[-1] for ln in maps if "openblas" in ln and ln.split()[-1].startswith("/")})
    except OSError:
        pass
    return list(dict.fromkeys(found))


@functools.cache
def openblas() -> Blas:
    """numpy's OpenBLAS (the portable default), found without extra packages."""
    prefixes = ("scipy_", "")
    for path in _openblas_candidates():
        lib = ctypes.CDLL(path)  # same path as numpy's import: the same already-loaded instance
        for p in prefixes:
            gemm = getattr(lib, f"{p}cblas_sgemm64_", None)
            if gemm is None:
                continue
            set_t = getattr(lib, f"{p}openblas_set_num_threads64_")
            set_t.argtypes, set_t.restype = [ctypes.c_int], None
            get_t = getattr(lib, f"{p}openblas_get_num_threads64_")
            get_t.argtypes, get_t.restype = [], ctypes.c_int
            # OpenBLAS 0.3.31's cblas_sgemm_batch_strided segfaults in numpy's build: never used.
            return Blas("openblas", path, _addr(lib, gemm.__name__), 0, set_t, get_t)
    raise DynshapeError(
        "cannot find numpy's ILP64 OpenBLAS (symbol scipy_cblas_sgemm64_); "
        "install numpy from PyPI (`pip install numpy`) or `pip install mkl`"
    )


def _mkl_path() -> str | None:
    try:
        dist = importlib.metadata.distribution("mkl")
    except importlib.metadata.PackageNotFoundError:
        return None
    libs = sorted(str(dist.locate_file(f)) for f in dist.files or () if Path(str(f)).name.startswith("libmkl_rt.so"))
    return next((p for p in libs if os.path.exists(p)), None)


_MKL_LAYERS = {"intel": 0, "sequential": 1, "gnu": 3, "tbb": 4}


@functools.cache
def mkl() -> Blas | None:
    """MKL from PyPI (`pip install mkl`), or None when not installed.

    Uses the GNU OpenMP threading layer unless MKL_THREADING_LAYER says otherwise: libgomp is the runtime
    `gcc -fopenmp` kernels use, so the two share one thread pool instead of fighting over two cores.
    """
    path = _mkl_path()
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    if not hasattr(lib, "cblas_sgemm_64"):  # no ILP64 `_64` entry points (tested: mkl 2026.2): unusable
        return None
    layer = mkl_threading_layer()
    lib.MKL_Set_Threading_Layer.argtypes, lib.MKL_Set_Threading_Layer.restype = [ctypes.c_int], ctypes.c_int
    lib.MKL_Set_Threading_Layer(_MKL_LAYERS.get(layer, 3))  # must precede any other MKL call
    set_t = lib.MKL_Set_Num_Threads
    set_t.argtypes, set_t.restype = [ctypes.c_int], None
    get_t = lib.MKL_Get_Max_Threads
    get_t.argtypes, get_t.restype = [], ctypes.c_int
    return Blas("mkl", path, _addr(lib, "cblas_sgemm_64"), _addr(lib, "cblas_sgemm_batch_strided_64"), set_t, get_t)


def available() -> list[Blas]:
    """Every usable library, the portable one first."""
    return [openblas(), *([m] if (m := mkl()) is not None else [])]


def get(name: str) -> Blas:
    """A library by name ('openblas' or 'mkl'); a DynshapeError saying how to get it when absent."""
    if name == "openblas":
        return openblas()
    if name == "mkl":
        m = mkl()
        if m is None:
            raise DynshapeError("MKL requested but not installed: `pip install mkl` (about 220 MB download)")
        return m
    raise DynshapeError(f"unknown BLAS {name!r}: choose 'openblas' or 'mkl'")


def resolve(choice: str = "auto") -> Blas:
    """The library for a `blas` option: auto (MKL when installed, measured faster: bench/gemm_bench.py; else
    OpenBLAS), mkl or openblas."""
    return (mkl() or openblas()) if choice == "auto" else get(choice)


def bind(lib: ctypes.CDLL, blas: Blas | None = None) -> None:
    """Install `blas` (default: resolve("auto")) into a library that includes ds_blas.h."""
    blas = blas or resolve()
    fn = lib.ds_bind_blas
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p], None
    fn(blas.sgemm, blas.sgemm_strided or None)
