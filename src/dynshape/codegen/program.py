"""Run a bound plan's native steps in one foreign call instead of one ctypes call each.

A planned call is a list of pre-bound steps whose arguments are fixed integers (addresses, extents). Each
ctypes call costs about a microsecond; a transformer layer has ~20 steps, so at batch 1 the calls cost as much
as a few of the kernels. Consecutive native steps are packed into one int64 program
    [fn, nargs, arg0, ..., fn, nargs, ...]
that `ds_run_program` walks in C. Data-movement steps (Transpose, Expand: a strided view copied into a
contiguous buffer) get a C copy too, so they join the program instead of splitting it.

The C is csrc/ds_program.c.
"""

from __future__ import annotations

import ctypes

from dynshape.codegen.clib import I64, P, declare

MAX_ARGS = 16  # DS_PROGRAM_MAX_ARGS in ds_program.c

LIBRARY = declare("program", "ds_program.c", {"ds_run_program": (P, I64), "ds_copy_strided": (P,), "ds_concat": (P,),
                                                    "ds_permute_rows": (P,),
                                                    "ds_first_fit": (I64, P, P, P, P, P, P),
                                                    "ds_gather_elements": (P,), "ds_binary_f32": (P,),
                                                    "ds_gather_pick": (P,), "ds_gather_rows": (P,),
                                                    "ds_run_loop": (P, I64, I64, I64),
                                                    "ds_copy_general": (P,), "ds_scatter_bytes": (P, I64, P),
                                                    "ds_gather_bytes": (P, I64, P), "ds_range_int": (P,),
                                                    "ds_gather_rows_st": (P,), "ds_put_words": (P, P, I64, I64, I64)},
                  openmp=True, restypes={"ds_first_fit": ctypes.c_int64, "ds_gather_elements": ctypes.c_int64,
                                         "ds_gather_rows": ctypes.c_int64, "ds_run_loop": ctypes.c_int64,
                                         "ds_put_words": ctypes.c_int64})


def address(cfunc) -> int:
    """Entry address of a ctypes function."""
    return ctypes.cast(cfunc, ctypes.c_void_p).value
