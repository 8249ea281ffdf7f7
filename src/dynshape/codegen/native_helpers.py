"""The small C libraries the lowerings compile on first use (erf, row kernels, GEMM binding).

Artefacts ship them: `build_all()` compiles each into the current build cache (an artefact's libs/ while
saving), and `load_all()` makes this process load them now, from that cache, so no later call compiles.
"""

from __future__ import annotations

import numpy as np

from dynshape.codegen import gemm, numpy_lowering, packed_gemm, program, row_kernels
from dynshape.codegen.cc import CompileError, compile_c

SPECS = (numpy_lowering.erf_spec, row_kernels.spec, gemm.spec, program.spec, packed_gemm.spec)


def build_all() -> None:
    """Compile (or fetch) every helper into the current cache directory; silent without a compiler."""
    for spec in SPECS:
        try:
            compile_c(**spec())
        except CompileError:
            return


def load_all() -> None:
    """Load every helper into this process (each loader falls back to numpy without a compiler)."""
    numpy_lowering._erf_native(np.zeros(1, np.float32))
    row_kernels.library()
    gemm.blas_name()
    program.library()
    packed_gemm.library()
