"""The small C libraries the lowerings use (row kernels, erf, BLAS binding, packed GEMM, program runner).

Artefacts ship them: `build_all()` compiles each into the current build cache (an artefact's libs/ while
saving), and `load_all()` makes this process load them now, from that cache, so no later call compiles.
"""

from __future__ import annotations

from dynshape.codegen import clib, gemm, numpy_lowering, packed_gemm, program, rnn_kernel, row_kernels

MODULES = (gemm, numpy_lowering, packed_gemm, program, rnn_kernel, row_kernels)  # each declares its clib.CLibrary


def build_all() -> None:
    """Compile (or fetch) every helper into the current cache directory; silent without a compiler."""
    clib.build_all()


def load_all() -> None:
    """Load every helper into this process (each loader falls back to numpy without a compiler)."""
    clib.load_all()
    gemm.blas_name()  # binds the BLAS into the gemm library
