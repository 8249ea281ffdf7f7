"""Native ScatterND, ScatterElements (and the old Scatter): one C call per run (csrc/ds_scatter.c) that copies the
data into the planned output and writes the updates at their indices, after checking every index.

Why: exports write into token ids per call (BART's `shift_tokens_right`: the ids shifted one right by a ScatterND
from the classic exporter, a ScatterElements from the dynamo one), and both ran on the reference's numpy every
call ("no kernel lowering"). The call raises, naming the node, when an index lies outside the data (nothing is
written), as the reference's IndexError would; a reduction other than none / add / mul (max, min: numpy's
NaN and signed-zero rules) stays on the reference, as do buffers that are not contiguous (a broadcast data view).
"""

from __future__ import annotations

import math

import numpy as np

from dynshape.codegen.clib import I64, P, declare
from dynshape.codegen.cshared import SCATTER_EL, SCATTER_MAX_RANK, SCATTER_ND, ScatterReduction, ScatterType
from dynshape.codegen.lower.movement import elements_axis
from dynshape.codegen.lowering import BindRequest, NativeRule, register_lowering
from dynshape.errors import DynshapeError
from dynshape.ir.graph import Graph, Node

LIBRARY = declare("scatter", "ds_scatter.c", {"ds_scatter_nd": (P,), "ds_scatter_elements": (P,)},
                  restypes={"ds_scatter_nd": I64, "ds_scatter_elements": I64})

_TYPES = {"float32": ScatterType.F32, "float64": ScatterType.F64, "int32": ScatterType.I32,
          "int64": ScatterType.I64}
_REDUCTIONS = {"none": ScatterReduction.NONE, "add": ScatterReduction.ADD, "mul": ScatterReduction.MUL}
_PLAIN = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
          "float64"}


def _accepts(node: Node, graph: Graph) -> str | None:
    types = [graph.types.get(v) for v in (*node.inputs[:3], *node.outputs[:1])]
    if len(node.inputs) != 3 or any(getattr(t, "shape", None) is None for t in types):
        return "not three tensors in"
    x, idx, upd, y = (np.dtype(t.dtype).name for t in types)
    if not x == upd == y or x not in _PLAIN:
        return f"data {x}, updates {upd}, output {y}: one plain dtype is needed"
    if idx not in ("int32", "int64"):
        return f"indices {idx}"
    reduction = node.attrs.get("reduction", "none")
    if reduction not in _REDUCTIONS:
        return f"reduction {reduction!r} (numpy's NaN and signed-zero rules: the reference keeps it)"
    if reduction != "none" and x not in _TYPES:
        return f"reduction {reduction!r} of {x}"
    ranks = [len(t.shape) for t in types]
    return None if 1 <= min(ranks) and max(ranks) <= SCATTER_MAX_RANK else f"ranks {ranks}"


def _plain_buffers(x: np.ndarray, idx: np.ndarray, upd: np.ndarray, out: np.ndarray | None) -> bool:
    return (out is not None and out.shape == x.shape and x.dtype == out.dtype == upd.dtype
            and all(a.flags.c_contiguous for a in (x, idx, upd, out)) and idx.dtype.name in ("int32", "int64"))


def _call(fn, desc, label: str, what: str) -> list:  # noqa: ANN001 - a ctypes function
    def scatter() -> None:
        bad = fn(desc.addr)  # the table's address, known once the plan is sealed
        if bad:
            raise DynshapeError(f"{label}: {bad} of the indices are out of range for {what}; nothing was written")

    return [scatter]


def _fields(r: BindRequest, x: np.ndarray, idx: np.ndarray, upd: np.ndarray, out: np.ndarray) -> dict:
    reduction = r.attrs.get("reduction", "none")
    return {"ITEMSIZE": x.itemsize, "I32": int(idx.dtype == np.int32), "REDUCTION": int(_REDUCTIONS[reduction]),
            "TYPE": int(_TYPES.get(x.dtype.name, ScatterType.OTHER)), "NBYTES": out.nbytes, "OUT": r.addr(out),
            "X": r.addr(x), "IDX": r.addr(idx), "UPD": r.addr(upd)}


def _bind_scatter_nd(r: BindRequest) -> list | None:
    """ds_scatter_nd: updates of idx.shape[:-1] slices, each at the index tuple of idx's last axis."""
    lib = LIBRARY.try_load()
    x, idx, upd = r.ins[:3]
    out = r.outs[0]
    if lib is None or not _plain_buffers(x, idx, upd, out) or idx.ndim < 1:
        return None
    k = idx.shape[-1]
    if not 1 <= k <= x.ndim or upd.shape != (*idx.shape[:-1], *x.shape[k:]):
        return None  # the reference's error
    fields = {**_fields(r, x, idx, upd, out), "K": k, "M": math.prod(idx.shape[:-1]), "SLICE": math.prod(x.shape[k:])}
    desc = r.keep.table([fields[f] for f in SCATTER_ND] + [*x.shape[:k], *out.strides[:k]])
    return _call(lib.ds_scatter_nd, desc, r.node.label(), f"data of shape {x.shape}")


def _bind_scatter_elements(r: BindRequest) -> list | None:
    """ds_scatter_elements: each update at its own position with the axis' coordinate replaced by its index."""
    lib = LIBRARY.try_load()
    x, idx, upd = r.ins[:3]
    out = r.outs[0]
    if lib is None or not _plain_buffers(x, idx, upd, out) or not x.ndim == idx.ndim == upd.ndim \
            or idx.shape != upd.shape:
        return None
    axis = elements_axis(r.attrs, x.shape, idx.shape)
    if axis is None:
        return None  # the reference's error
    n = x.shape[axis]
    fields = {**_fields(r, x, idx, upd, out), "RANK": x.ndim, "AXIS": axis, "N": n}
    desc = r.keep.table([fields[f] for f in SCATTER_EL] + [*idx.shape, *out.strides])
    return _call(lib.ds_scatter_elements, desc, r.node.label(),
                 f"[-{n}, {n}) on axis {axis} of data of shape {x.shape}")


register_lowering("ScatterND", "native", NativeRule(_accepts, _bind_scatter_nd))
register_lowering("ScatterElements", "native", NativeRule(_accepts, _bind_scatter_elements))
register_lowering("Scatter", "native", NativeRule(_accepts, _bind_scatter_elements))
