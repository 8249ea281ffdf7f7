"""Native code generation: C compiler driver with disk cache (cc), BLAS binding (blas), C printers (cgen).

Kept import-light: submodules load numpy/ctypes only when imported themselves.
"""
