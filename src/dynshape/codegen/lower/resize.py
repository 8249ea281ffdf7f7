"""Channels-last 2-D Resize / Upsample (nearest and linear): bound per plan to a C kernel with tap tables.

The tables (per output row and column: the source rows / columns and the second tap's weight) depend only on
the shapes and the scales, so they are computed once per key, by running the op's own numpy reference on an
identity probe: its output is the interpolation matrix of that axis, whatever the coordinate transformation
mode, rounding rule or exclude_outside. So the kernel can never disagree with the reference on which pixels
it reads; only the float32 rounding of the blend differs (a few ulp). Cubic, antialiasing and
tf_crop_and_resize run the reference.
"""

from __future__ import annotations

import functools

import numpy as np

from dynshape.codegen.clib import P, declare
from dynshape.codegen.lower.channels_last import register_channels_last
from dynshape.codegen.lowering import BindRequest, NativeCall, NativeRule
from dynshape.ir import opdef
from dynshape.ir.graph import Graph, Node
from dynshape.passes.values import is_float32

LIBRARY = declare("resize", "ds_resize.c", {"ds_resize2d_nhwc": (P,)}, openmp=True)
MAX_PROBE = 4096  # rows of the identity probe (its matrix is rows x output rows float64)


def _accepts(node: Node, graph: Graph) -> str | None:
    inner = node.attrs.get("op")
    if inner not in ("Resize", "Upsample"):
        return "not a Resize"
    mode = node.attrs.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        return f"mode {mode!r} (cubic runs the reference)"
    if node.attrs.get("antialias", 0) or node.attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        return "antialias / tf_crop_and_resize"
    if node.attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch" or node.attrs.get("axes") is not None:
        return "keep_aspect_ratio_policy / axes"
    x = graph.types.get(node.inputs[0])
    if not (is_float32(x) and len(x.shape) == 4 and is_float32(graph.types.get(node.outputs[0]))):
        return "not a float32 2-D image"
    return None


def _taps(attrs: dict, n_in: int, n_out: int, scale: float | None, opset: int) -> tuple:
    """(first taps, second taps, weight of the second) of one axis, from the reference on an identity probe;
    shared by every plan whose axis has these sizes (each plan of a detector at a new shape needed its own
    before: 1.7 MB of tables over 300 shapes)."""
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))
    try:
        hash(items)
    except TypeError:  # an attribute value that cannot key a cache
        return _compute_taps(attrs, n_in, n_out, scale, opset)
    return _taps_of(items, n_in, n_out, scale, opset)


@functools.lru_cache(maxsize=1024)
def _taps_of(attrs_items: tuple, n_in: int, n_out: int, scale: float | None, opset: int) -> tuple:
    first, second, w2 = _compute_taps(dict(attrs_items), n_in, n_out, scale, opset)
    for t in (first, second, w2):
        t.flags.writeable = False
    return first, second, w2


def _compute_taps(attrs: dict, n_in: int, n_out: int, scale: float | None, opset: int) -> tuple:
    probe = np.eye(n_in, dtype=np.float64).reshape(1, n_in, n_in, 1)
    ref = opdef.lookup(attrs["op"]).reference
    inner = {k: v for k, v in attrs.items() if k != "op"}
    if scale is not None:
        scales = np.array([1.0, 1.0, scale, 1.0], np.float32)
        args = [probe, scales] if opset < 11 else [probe, None, scales, None]
    else:
        args = [probe, None, None, np.array([1, n_in, n_out, 1], np.int64)]
    m = ref(args, inner)[0].reshape(n_in, -1).T  # (n_out, n_in): output row <- weights of the input rows
    if m.shape[0] != n_out:
        raise ValueError(f"probe gave {m.shape[0]} rows, the plan has {n_out}")
    first = np.argmax(m != 0, axis=1)
    weights = np.where(m != 0, m, 0)
    nz = (m != 0).sum(axis=1)
    if nz.max(initial=0) > 2:
        raise ValueError("more than two taps")
    second = np.where(nz == 2, n_in - 1 - np.argmax((m != 0)[:, ::-1], axis=1), first)
    w2 = np.where(nz == 2, weights[np.arange(n_out), second], 0.0)
    return first.astype(np.int64), second.astype(np.int64), w2.astype(np.float32)


def _bind(r: BindRequest) -> list | None:
    x, y = r.ins[0], r.outs[0]
    n, h, w, c = x.shape
    oh, ow = y.shape[1], y.shape[2]
    if max(h, w) > MAX_PROBE or any(v is not None and name not in r.fixed
                                    for name, v in zip(r.node.inputs[1:], r.ins[1:])):
        return None
    opset = r.attrs.get("_opset", 19)
    scales = r.ins[1] if opset < 11 else (r.ins[2] if len(r.ins) > 2 and r.ins[2] is not None and r.ins[2].size
                                           else None)
    if scales is not None and (float(scales[0]) != 1.0 or float(scales[1]) != 1.0):
        return None
    attrs = {k: v for k, v in r.attrs.items() if not k.startswith("_")} | {"_opset": opset}
    try:
        th = _taps(attrs, h, oh, None if scales is None else float(scales[2]), opset)
        tw = _taps(attrs, w, ow, None if scales is None else float(scales[3]), opset)
    except ValueError:
        return None
    lib = LIBRARY.try_load()
    if lib is None:
        return None
    linear = r.attrs.get("mode", "nearest") == "linear"
    ldy = _pixel_stride(y)
    if ldy is None or not x.flags.c_contiguous:
        return None
    tables = [*th, *tw]
    r.keep.extend(tables)
    args = r.keep.table([r.addr(x), r.addr(y), n, h, w, c, oh, ow, *[t.ctypes.data for t in tables], int(linear),
                         ldy])
    return [NativeCall(lib.ds_resize2d_nhwc, (args,))]


def _pixel_stride(y: np.ndarray) -> int | None:
    """Floats between y's pixels when y (N, OH, OW, C) is dense or a channel slice of a wider buffer (its rows
    and images follow from that stride), else None."""
    ldy, item = y.strides[2] // y.itemsize, y.itemsize
    n, oh, ow, c = y.shape
    if y.strides[3] != item or ldy < c or (oh > 1 and y.strides[1] != ow * ldy * item) \
            or (n > 1 and y.strides[0] != oh * ow * ldy * item):
        return None
    return int(ldy)


register_channels_last("Resize", NativeRule(_accepts, _bind, lambda node: True))
register_channels_last("Upsample", NativeRule(_accepts, _bind, lambda node: True))
