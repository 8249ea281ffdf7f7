"""Row-wise C kernels for the reductions transformers spend time in: softmax and layer norm on the last axis.

numpy needs five to eight passes with temporaries for these; one row at a time in C keeps the row in
cache. The row length is a runtime argument, so one build serves every shape (the C is csrc/ds_rows.c). Built
once per process (and cached on disk by `cc.compile_c`); without a C compiler the callers fall back to numpy.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from dynshape.codegen.clib import F32, I64, P, declare
from dynshape.codegen.cshared import ReduceOp
from dynshape.codegen.lower.channels_last import register_channels_last
from dynshape.codegen.lowering import BindRequest, NativeCall, NativeRule, register_lowering
from dynshape.ir.graph import Graph, Node
from dynshape.passes.values import const_value, is_float32, reduction_axes

LIBRARY = declare("row_kernels", "ds_rows.c", {"ds_softmax_f32": (P, P, I64, I64),
                                                "ds_logsoftmax_f32": (P, P, I64, I64),
                                                "ds_softmax_mid_f32": (P, P, I64, I64, I64, I64),
                                                "ds_cumsum_args": (P,),
                                                "ds_topk_args": (P,),
                                                "ds_layernorm_f32": (P, P, P, P, I64, I64, F32),
                                                "ds_layernorm_args": (P,),
                                                "ds_reduce_args": (P,),
                                                "ds_lrn_f32": (P, P, I64, I64, I64, F32, F32, F32),
                                                "ds_chan_norm_args": (P,),
                                                "ds_instnorm_nhwc_f32": (P, P, P, P, I64, I64, I64, F32)},
                  openmp=True)


def library() -> ctypes.CDLL | None:
    """The row-kernel library, or None when no C compiler is available."""
    return LIBRARY.try_load()


def softmax_last(x: np.ndarray) -> np.ndarray | None:
    lib = library()
    if lib is None or x.dtype != np.float32 or x.ndim == 0:
        return None
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    n = x.shape[-1]
    if n:
        lib.ds_softmax_f32(x.ctypes.data, y.ctypes.data, x.size // n, n)
    return y


def layernorm_last(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray | None:
    lib = library()
    n = x.shape[-1] if x.ndim else 0
    if lib is None or x.dtype != np.float32 or not n or scale.size != n or (bias is not None and bias.size != n):
        return None
    x = np.ascontiguousarray(x)
    scale = np.ascontiguousarray(scale, dtype=np.float32)
    bias_ptr = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    y = np.empty_like(x)
    lib.ds_layernorm_f32(x.ctypes.data, scale.ctypes.data, None if bias_ptr is None else bias_ptr.ctypes.data,
                         y.ctypes.data, x.size // n, n, eps)
    return y


# ---- native lowerings: LayerNormalization / Softmax rows bound to a plan's buffers -------------------------
def _last_axis(node: Node, graph: Graph, default: int) -> str | None:
    x, y = graph.types.get(node.inputs[0]), graph.types.get(node.outputs[0])
    if not (is_float32(x) and is_float32(y)):
        return "not float32"
    rank = len(x.shape)
    if node.attrs.get("axis", default) not in (-1, rank - 1) or rank == 0:
        return f"axis {node.attrs.get('axis', default)} is not the last of rank {rank}"
    return None


def _layernorm_accepts(node: Node, graph: Graph) -> str | None:
    if any(o for o in node.outputs[1:]):
        return "Mean / InvStdDev outputs are requested"
    if not all(is_float32(graph.types.get(x)) for x in node.inputs if x):
        return "scale or bias is not float32"
    return _last_axis(node, graph, -1)


def _bind_layernorm(r: BindRequest) -> list | None:
    lib = library()
    x, scale = r.ins[0], r.ins[1]
    bias = r.ins[2] if len(r.ins) > 2 else None
    n = x.shape[-1] if x.ndim else 0
    if lib is None or not n or scale.size != n or (bias is not None and bias.size != n):
        return None
    eps = np.array([r.attrs.get("epsilon", 1e-5)], np.float32).view(np.int32)[0]
    args = r.keep.table([r.addr(x), r.addr(scale), 0 if bias is None else r.addr(bias), r.addr(r.outs[0]),
                         x.size // n, n, eps])
    return [NativeCall(lib.ds_layernorm_args, (args,))]


def _softmax_accepts(node: Node, graph: Graph) -> str | None:
    """Float32 over any axis: the last one as contiguous rows, another as strided rows (yolov8's DFL softmax over
    16 bins of (N, 4, 16, A)); below opset 13 the flattened axes from `axis` on, contiguous rows again."""
    x, y = graph.types.get(node.inputs[0]), graph.types.get(node.outputs[0])
    if not (is_float32(x) and is_float32(y)) or not x.shape:
        return "not float32 of rank >= 1"
    opset = node.attrs.get("_opset", graph.opset)
    axis, rank = int(node.attrs.get("axis", -1 if opset >= 13 else 1)), len(x.shape)
    return None if -rank <= axis < rank else f"axis {axis} is out of range for rank {rank}"


def softmax_geometry(shape: tuple[int, ...], attrs: dict, opset: int) -> tuple[int, int, int]:
    """(outer, n, inner): the softmax reduces over n elements `inner` apart, for each of outer * inner lanes."""
    rank = len(shape)
    axis = int(attrs.get("axis", -1 if opset >= 13 else 1)) % rank
    if opset < 13:  # one softmax over the flattened axes from `axis` on
        return math.prod(shape[:axis]), math.prod(shape[axis:]), 1
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _bind_softmax(r: BindRequest) -> list | None:
    lib = library()
    x, y = r.ins[0], r.outs[0]
    if lib is None or y is None or x.ndim == 0 or not x.flags.c_contiguous or not y.flags.c_contiguous:
        return None
    outer, n, inner = softmax_geometry(x.shape, r.attrs, r.attrs.get("_opset", 13))
    log = int(r.node.op_type == "LogSoftmax")
    if not outer * n * inner:
        return []
    if inner == 1:
        fn = lib.ds_logsoftmax_f32 if log else lib.ds_softmax_f32
        return [NativeCall(fn, (r.addr(x), r.addr(y), outer, n))]
    return [NativeCall(lib.ds_softmax_mid_f32, (r.addr(x), r.addr(y), outer, n, inner, log))]


# each reduction ds_reduce_f32 computes (ReduceL2: ConvNeXt V2's global response norm, each channel's map's norm)
REDUCE_OPS = {"ReduceSum": ReduceOp.SUM, "ReduceMean": ReduceOp.MEAN, "ReduceMax": ReduceOp.MAX,
              "ReduceMin": ReduceOp.MIN, "ReduceL2": ReduceOp.L2, "ReduceSumSquare": ReduceOp.SUM_SQUARE,
              "ReduceL1": ReduceOp.L1}


def _reduced_block(node: Node, rank: int, value) -> tuple[int, int] | None:  # noqa: ANN001
    """(first axis, count) of the axes a Reduce* node reduces when they are consecutive (so, in a C-contiguous
    array, one middle axis of (outer, n, inner)), else None. Empty axes: all of them, unless noop_with_empty_axes
    (a copy) or an axes input whose value is not known."""
    axes = reduction_axes(node, value)
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0) or (axes is None and len(node.inputs) > 1 and node.inputs[1]):
            return None
        return 0, rank
    if not all(-rank <= a < rank for a in axes):
        return None
    got = sorted({a % rank for a in axes})
    return (got[0], len(got)) if got == list(range(got[0], got[0] + len(got))) else None


def _reduce_accepts(node: Node, graph: Graph) -> str | None:
    x, y = graph.types.get(node.inputs[0]), graph.types.get(node.outputs[0])
    if not (is_float32(x) and is_float32(y)) or len(x.shape) == 0:
        return "not float32 of rank >= 1"
    if _reduced_block(node, len(x.shape), lambda name: const_value(name, graph)) is None:
        return "its axes are not consecutive (or not constant)"
    return None


def _bind_reduce(r: BindRequest) -> list | None:
    lib = library()
    x, y = r.ins[0], r.outs[0]
    axes_value = {r.node.inputs[1]: np.asarray(r.ins[1])} if len(r.ins) > 1 and r.ins[1] is not None else {}
    block = _reduced_block(r.node, x.ndim, axes_value.get)
    if lib is None or block is None or y is None or not x.flags.c_contiguous or not y.flags.c_contiguous:
        return None
    a, count = block
    outer, n, inner = math.prod(x.shape[:a]), math.prod(x.shape[a:a + count]), math.prod(x.shape[a + count:])
    if not outer * inner:
        return []
    args = r.keep.table([r.addr(x), r.addr(y), outer, n, inner, int(REDUCE_OPS[r.node.op_type])])
    return [NativeCall(lib.ds_reduce_args, (args,))]


register_lowering("LayerNormalization", "native", NativeRule(_layernorm_accepts, _bind_layernorm))
for _op in REDUCE_OPS:
    register_lowering(_op, "native", NativeRule(_reduce_accepts, _bind_reduce))
for _op in ("Softmax", "LogSoftmax"):
    register_lowering(_op, "native", NativeRule(_softmax_accepts, _bind_softmax))


# ---- CumSum: roberta's position ids (mask.cumsum(1) * mask + padding_idx) -------------------------------------
_KIND = {"float32": 0, "int32": 1, "int64": 2}  # the element-type codes ds_cumsum and ds_topk take


def _cumsum_accepts(node: Node, graph: Graph) -> str | None:
    """float32 / int32 / int64 in and out, the axis a constant (the row kernel's geometry is fixed per key)."""
    ts = [graph.types.get(x) for x in (node.inputs[0], node.outputs[0])]
    types = {np.dtype(t.dtype).name if getattr(t, "dtype", None) is not None else "none" for t in ts}
    if len(types) != 1 or not types <= set(_KIND):
        return f"dtype {sorted(types)}, the kernel sums float32, int32 or int64"
    if len(getattr(graph.types.get(node.inputs[0]), "shape", ())) == 0:
        return "rank 0"
    a = const_value(node.inputs[1], graph)
    return None if a is not None and a.size == 1 else "the axis is not a constant"


def _bind_cumsum(r: BindRequest) -> list | None:
    lib = library()
    x, y = r.ins[0], r.outs[0]
    a = np.asarray(r.ins[1])
    if lib is None or y is None or x.ndim == 0 or r.node.inputs[1] not in r.fixed or a.size != 1 \
            or x.dtype != y.dtype or x.dtype.name not in _KIND \
            or not x.flags.c_contiguous or not y.flags.c_contiguous:
        return None
    axis = int(a.reshape(-1)[0])
    if not -x.ndim <= axis < x.ndim:
        return None  # the reference's path raises its error
    axis %= x.ndim
    outer, n, inner = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:])
    if not outer * n * inner:
        return []
    args = r.keep.table([r.addr(x), r.addr(y), outer, n, inner, _KIND[x.dtype.name],
                         int(bool(r.attrs.get("exclusive", 0))), int(bool(r.attrs.get("reverse", 0)))])
    return [NativeCall(lib.ds_cumsum_args, (args,))]


register_lowering("CumSum", "native", NativeRule(_cumsum_accepts, _bind_cumsum))


# ---- TopK: sorted k first of each slice (a sequence encoder's lengths sorted for packing, detectors' scores) ----
def _topk_k(node: Node, value) -> int | None:  # noqa: ANN001
    """k: the `k` attribute (opset < 10) or the constant second input; None when it is neither."""
    if len(node.inputs) > 1 and node.inputs[1]:
        a = value(node.inputs[1])
        return None if a is None or np.asarray(a).size != 1 else int(np.asarray(a).reshape(-1)[0])
    k = node.attrs.get("k")
    return None if k is None else int(k)


def _topk_accepts(node: Node, graph: Graph) -> str | None:
    """float32 / int32 / int64 values, k a constant (the kernel's geometry is fixed per key)."""
    t = graph.types.get(node.inputs[0])
    if np.dtype(getattr(t, "dtype", None) or "V").name not in _KIND or not getattr(t, "shape", ()):
        return "not float32 / int32 / int64 of rank >= 1"
    return None if _topk_k(node, lambda name: const_value(name, graph)) is not None else "k is not a constant"


def _bind_topk(r: BindRequest) -> list | None:
    lib = library()
    x, (values, indices) = r.ins[0], (list(r.outs) + [None, None])[:2]
    k = _topk_k(r.node, lambda name: np.asarray(r.fixed[name]) if name in r.fixed else None)
    if lib is None or k is None or values is None or indices is None or x.ndim == 0 \
            or x.dtype.name not in _KIND or values.dtype != x.dtype or indices.dtype != np.int64 \
            or not all(a.flags.c_contiguous for a in (x, values, indices)):
        return None
    axis = int(r.attrs.get("axis", -1))
    if not -x.ndim <= axis < x.ndim:
        return None  # the reference's path raises its error
    axis %= x.ndim
    outer, n, inner = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:])
    if not 0 <= k <= n:
        return None  # the reference's path names the violation
    if not outer * k * inner:
        return []
    scratch = r.scratch(16 * n, "topk") if r.scratch is not None else np.empty(2 * n, np.int64)
    if r.scratch is None:
        r.keep.hold(scratch)
    args = r.keep.table([r.addr(x), r.addr(values), r.addr(indices), outer, n, inner, k,
                         int(bool(r.attrs.get("largest", 1))), _KIND[x.dtype.name], r.addr(scratch)])
    return [NativeCall(lib.ds_topk_args, (args,))]


register_lowering("TopK", "native", NativeRule(_topk_accepts, _bind_topk))


# ---- LRN on channels-last rows (the layout pass wraps it: ChannelsLast(LRN) normalises the last axis) --------
def _lrn_accepts(node: Node, graph: Graph) -> str | None:
    if node.attrs.get("op") != "LRN":
        return "not an LRN"
    x, y = graph.types.get(node.inputs[0]), graph.types.get(node.outputs[0])
    return None if is_float32(x) and is_float32(y) and len(x.shape) >= 3 else "not float32"


def _bind_lrn(r: BindRequest) -> list | None:
    lib = library()
    x, out = r.ins[0], r.outs[0]
    n = x.shape[-1]
    if lib is None or out is None or not n or not x.flags.c_contiguous or not out.flags.c_contiguous:
        return None
    a = r.attrs
    return [NativeCall(lib.ds_lrn_f32, (r.addr(x), r.addr(out), x.size // n, n, int(a["size"]),
                                        float(a.get("alpha", 1e-4)), float(a.get("beta", 0.75)),
                                        float(a.get("bias", 1.0))))]


register_channels_last("LRN", NativeRule(_lrn_accepts, _bind_lrn))


# ---- InstanceNormalization / GroupNormalization: rows of whole feature maps, channels first or last -------------
def _norm_accepts(node: Node, graph: Graph) -> str | None:
    """Float32 throughout with scale and bias given; the statistics accumulate in double (at least the float32
    that GroupNormalization's stash_type asks for)."""
    ins = [graph.types.get(x) for x in node.inputs]
    if len(ins) < 3 or not all(is_float32(t) for t in (*ins, graph.types.get(node.outputs[0]))):
        return "not float32 (or scale / bias omitted)"
    if len(ins[0].shape) < 2:
        return "rank < 2"
    return None


def _eps_bits(attrs: dict) -> int:
    return int(np.array([attrs.get("epsilon", 1e-5)], np.float32).view(np.int32)[0])


def _bind_chan_norm(r: BindRequest) -> list | None:
    lib = library()
    x, scale, bias = r.ins[0], r.ins[1], r.ins[2]
    batch, c = x.shape[0], x.shape[1]
    hw = int(np.prod(x.shape[2:], dtype=np.int64))
    if r.node.op_type == "GroupNormalization":
        g = int(r.attrs["num_groups"])
        if g <= 0 or c % g:
            return None
        # a row per (sample, group): its C / G channels, each with its own scale (opset 18's per-group scale is
        # refused at load: that opset's GroupNormalization is deprecated)
        rows, n, hw_, cpr, channels = batch * g, (c // g) * hw, hw, c // g, c
    else:
        rows, n, hw_, cpr, channels = batch * c, hw, hw, 1, c
    if lib is None or not n or not rows or scale.size != channels or bias.size != channels \
            or not x.flags.c_contiguous or not r.outs[0].flags.c_contiguous:
        return None
    return _chan_norm_call(r, lib, rows, n, hw_, cpr, channels)


def _chan_norm_call(r: BindRequest, lib, rows: int, n: int, hw: int, cpr: int, channels: int) -> list:  # noqa: ANN001
    """ds_chan_norm_args over `rows` rows of n elements (cpr channels of hw each), the request's four buffers."""
    x, scale, bias, out = r.ins[0], r.ins[1], r.ins[2], r.outs[0]
    args = r.keep.table([r.addr(x), r.addr(scale), r.addr(bias), r.addr(out), rows, n, hw, cpr, channels,
                         _eps_bits(r.attrs)])
    return [NativeCall(lib.ds_chan_norm_args, (args,))]


def _instnorm_last_accepts(node: Node, graph: Graph) -> str | None:
    return "not an InstanceNormalization" if node.attrs.get("op") != "InstanceNormalization" else \
        _norm_accepts(node, graph)


def _bind_instnorm_last(r: BindRequest) -> list | None:
    lib = library()
    x, scale, bias, out = r.ins[0], r.ins[1], r.ins[2], r.outs[0]
    batch, c = x.shape[0], x.shape[-1]
    hw = int(np.prod(x.shape[1:-1], dtype=np.int64))
    if lib is None or out is None or not hw or not c or scale.size != c or bias.size != c \
            or not x.flags.c_contiguous or not out.flags.c_contiguous:
        return None
    if c == 1:  # (batch, hw, 1) holds the bytes of (batch, 1, hw): one long row an image, the channels-first
        # kernel's (torch's GroupNorm(1) export, PoolFormer: per position, a one-channel loop ran ~8x slower)
        return _chan_norm_call(r, lib, batch, hw, hw, 1, 1)
    eps = float(np.float32(r.attrs.get("epsilon", 1e-5)))
    return [NativeCall(lib.ds_instnorm_nhwc_f32, (r.addr(x), r.addr(scale), r.addr(bias), r.addr(out), batch, hw, c,
                                                  eps))]


for _op in ("InstanceNormalization", "GroupNormalization"):
    register_lowering(_op, "native", NativeRule(_norm_accepts, _bind_chan_norm))
register_channels_last("InstanceNormalization", NativeRule(_instnorm_last_accepts, _bind_instnorm_last))
