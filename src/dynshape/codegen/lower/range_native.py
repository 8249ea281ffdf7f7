"""Native Range over integers (csrc/ds_program.c's ds_range_int): start and delta read where they lie when the call
runs (constants, or values of the key: a decode step's position [past, past + 1), its mask's columns [0, past]),
the length its output's, which inference made from the same values.

Why: a bucket plan runs such per-key steps in its arena on every call (runtime/per_key.py), where the reference's
numpy arange cost ~8 us a call; here it joins the plan's program, and its words are plain arithmetic on the shapes
and addresses (`retable`), which a bucket plan traces into the key's compiled function: a move rewrites them with
no Python per step. Float Ranges (numpy's float arange rounds its own way) keep the reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.codegen import program
from dynshape.codegen.lowering import BindRequest, NativeCall, NativeRule, RetableRequest, register_lowering
from dynshape.ir.graph import Graph, Node

_INTS = ("int32", "int64")


def _accepts(node: Node, graph: Graph) -> str | None:
    types = [graph.types.get(x) if x else None for x in (*node.inputs[:3], node.outputs[0])]
    if any(getattr(t, "shape", None) is None for t in types) or len({np.dtype(t.dtype) for t in types}) != 1 \
            or np.dtype(types[-1].dtype).name not in _INTS:
        return "not int32 / int64 tensors of one type (float ranges keep numpy's rounding)"
    return None


def _words(out: Any, n: Any, start: Any, delta: Any, itemsize: int) -> list:
    """ds_range_int's table: the output, its length, where start and delta lie, and whether they are int32."""
    return [out, n, start, delta, int(itemsize == 4)]


def _bind(r: BindRequest) -> list | None:
    out = r.outs[0]
    lib = program.LIBRARY.try_load()
    if lib is None or out is None or out.ndim != 1 or not out.flags.c_contiguous or len(r.ins) < 3:
        return None
    start, limit, delta = r.ins[:3]
    if any(not isinstance(v, np.ndarray) or v.size != 1 or v.dtype != out.dtype for v in (start, limit, delta)):
        return None
    if all(x in r.fixed for x in r.node.inputs[:3]):  # all known now: the length is checked against them
        s, lim, d = (int(v.reshape(())) for v in (start, limit, delta))
        if d == 0 or out.shape[0] != max(-(-(lim - s) // d), 0):
            return None  # the reference raises what it raises
    return [NativeCall(lib.ds_range_int, (r.keep.table(_words(r.addr(out), out.shape[0], r.addr(start),
                                                              r.addr(delta), out.itemsize)),))]


def _retable(r: RetableRequest) -> list | None:
    """`_bind`'s words at another key, from the output's length and the addresses alone (no comparison of dims:
    a bucket plan traces it)."""
    lib = program.LIBRARY.try_load()
    shape = r.out_shapes[0] if r.out_shapes else None
    if lib is None or r.fns != (lib.ds_range_int,) or shape is None or len(shape) != 1 or len(r.in_addrs) < 3 \
            or any(a is None for a in (r.out_addrs[0], r.in_addrs[0], r.in_addrs[2])):
        return None
    return [_words(r.out_addrs[0], shape[0], r.in_addrs[0], r.in_addrs[2], r.itemsize)]


register_lowering("Range", "native", NativeRule(_accepts, _bind, retable=_retable, params=lambda node: ()))
