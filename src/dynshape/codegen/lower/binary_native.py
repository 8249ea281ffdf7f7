"""Native float32 Add / Sub / Mul / Div for the nodes no kernel takes because their broadcast is decided only by
the call's shape: an operand dim that inference cannot prove equal to the output's, nor 1 (ppocr_det's FPN adds
an upsampled map of 2 * ceil(H / 32) rows to one of ceil(H / 16): the same at the multiples of 32 the model is
fed, 1 against 2 below 17; inference records the run-time check "equal or 1"). The binder sees the key's buffers,
so their broadcast strides are exact for the key; the call is one strided C loop (ds_binary_f32 in
csrc/ds_program.c) into the planned output, where numpy's ran in Python with a temporary. Nothing is assumed:
a shape that does not broadcast is refused by the binder and raises on the reference path as before.
"""

from __future__ import annotations

import numpy as np

from dynshape.codegen import program
from dynshape.codegen.lowering import BindRequest, NativeCall, NativeRule, register_lowering
from dynshape.ir.graph import Graph, Node
from dynshape.passes.values import is_float32

_OPS = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3}
MAX_RANK = 16  # ctr[16] in ds_binary_f32


def _accepts(node: Node, graph: Graph) -> str | None:
    ts = [graph.types.get(x) for x in (*node.inputs, *node.outputs)]
    if len(node.inputs) != 2 or not all(is_float32(t) for t in ts):
        return "not float32 with two operands"
    return None if len(ts[-1].shape) <= MAX_RANK else f"rank above {MAX_RANK}"


def _strides(a: np.ndarray, shape: tuple) -> list[int]:
    """`a`'s strides in elements over the broadcast `shape` (right-aligned; 0 on broadcast axes)."""
    pad = len(shape) - a.ndim
    return [0 if k < pad or a.shape[k - pad] == 1 else a.strides[k - pad] // a.itemsize for k in range(len(shape))]


def _merged(shape: tuple, xs: list[int], ys: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Adjacent dims merged where both operands step over the inner one whole, length-1 dims dropped: a bias
    add over (N, C, H, W) becomes (N, C, H * W), the bias's strides 0, 1, 0."""
    dims = [(n, a, b) for n, a, b in zip(shape, xs, ys) if n != 1] or [(1, 0, 0)]
    out = [list(dims[0])]
    for n, a, b in dims[1:]:
        m = out[-1]
        if m[1] == a * n and m[2] == b * n:
            m[0], m[1], m[2] = m[0] * n, a, b
        else:
            out.append([n, a, b])
    return [d[0] for d in out], [d[1] for d in out], [d[2] for d in out]


def _bind(r: BindRequest) -> list | None:
    lib = program.LIBRARY.try_load()
    x, y, out = r.ins[0], r.ins[1], r.outs[0]
    if lib is None or out is None or not out.flags.c_contiguous or x.dtype != np.float32 or y.dtype != np.float32:
        return None
    try:
        shape = np.broadcast_shapes(x.shape, y.shape)
    except ValueError:
        return None  # the reference path raises numpy's error
    if shape != out.shape or any(s % 4 for s in (*x.strides, *y.strides)):
        return None
    dims, xs, ys = _merged(shape, _strides(x, shape), _strides(y, shape))
    desc = r.keep.table([_OPS[r.node.op_type], len(dims), r.addr(out), r.addr(x), r.addr(y), *dims, *xs, *ys])
    r.keep.hold(x)
    r.keep.hold(y)
    return [NativeCall(lib.ds_binary_f32, (desc,))]


for _op in _OPS:
    register_lowering(_op, "native", NativeRule(_accepts, _bind))
