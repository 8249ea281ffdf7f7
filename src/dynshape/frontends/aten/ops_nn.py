"""Layers: normalisations, convolution, pooling, embedding, resizing, LSTM."""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.frontends.aten.common import cast, reshape, static_int, uses_output
from dynshape.frontends.aten.convert import handles
from dynshape.frontends.aten.emit import Tensor
from dynshape.frontends.aten.symbols import Unsupported


@handles("embedding.default")
def _embedding(cv: Any, node: Any, w: Tensor, idx: Tensor, padding_idx: int = -1, *rest: Any) -> Tensor:
    return cv.em.node("Gather", [w, cast(cv, idx, np.int64)], {"axis": 0}, hint=node.name)


@handles("native_layer_norm.default")
def _layer_norm(cv: Any, node: Any, x: Tensor, normalized: list, w: Any, b: Any, eps: float) -> tuple:
    em = cv.em
    dt = cv.dtype_of(x)
    n = len(normalized)
    norm_dims = tuple(cv.shape_of(x)[-n:])
    if w is None:
        if not all(isinstance(d, int) for d in norm_dims):
            raise Unsupported("layer_norm without a weight over symbolic dims")
        w = em.const(np.ones(norm_dims, dt))
    ins = [x, w] + ([b] if b is not None else [])
    want_stats = uses_output(node, 1) or uses_output(node, 2)
    attrs = {"axis": -n, "epsilon": float(eps), "stash_type": 1}
    if not want_stats:
        y = em.node("LayerNormalization", ins, attrs, hint=node.name, shape=cv.out_dims(index=0), dtype=dt)
        return (y, None, None)
    y, m, r = em.node("LayerNormalization", ins, attrs, n_out=3, hint=node.name,
                      shapes=[cv.out_dims(index=i) for i in range(3)], dtypes=[dt, np.float32, np.float32])
    return (y, m, r)


@handles("native_group_norm.default")
def _group_norm(cv: Any, node: Any, x: Tensor, w: Any, b: Any, n: Any, c: Any, hw: Any, groups: int,
                eps: float) -> tuple:
    """(x - mean) / sqrt(var + eps) over (C/G, H, W) per group, then the per-channel affine."""
    em = cv.em
    dt = cv.dtype_of(x)
    shape = cv.shape_of(x)
    g = static_int(groups, "num_groups")
    xg = reshape(cv, x, (shape[0], g, _prod(shape[1:]) // g))
    gs = cv.shape_of(xg)
    kept = (gs[0], g, 1)
    one = em.ints([2])
    mean = em.node("ReduceMean", [xg, one], {"keepdims": 1}, shape=kept, dtype=dt)
    d = em.node("Sub", [xg, mean], shape=gs, dtype=dt)
    var = em.node("ReduceMean", [em.node("Mul", [d, d], shape=gs, dtype=dt), one], {"keepdims": 1}, shape=kept,
                  dtype=dt)
    std = em.node("Sqrt", [em.node("Add", [var, em.const(np.array(eps, dt))], shape=kept, dtype=dt)], shape=kept,
                  dtype=dt)
    y = reshape(cv, em.node("Div", [d, std], shape=gs, dtype=dt), shape)
    ch = (shape[1],) + (1,) * (len(shape) - 2)
    if w is not None:
        y = em.node("Mul", [y, reshape(cv, w, ch)], shape=shape, dtype=dt)
    if b is not None:
        y = em.node("Add", [y, reshape(cv, b, ch)], shape=shape, dtype=dt)
    if uses_output(node, 1) or uses_output(node, 2):
        raise Unsupported("group_norm's mean / rstd outputs")
    return (y, None, None)


def _prod(dims: Any) -> Any:
    n: Any = 1
    for d in dims:
        n = n * d
    return n


@handles("_native_batch_norm_legit_no_training.default")
def _batch_norm(cv: Any, node: Any, x: Tensor, w: Any, b: Any, mean: Tensor, var: Tensor, momentum: float,
                eps: float) -> tuple:
    em = cv.em
    c = cv.shape_of(x)[1]
    dt = cv.dtype_of(x)
    if w is None:
        w = em.const(np.ones((static_int(c, "channels"),), dt))
    if b is None:
        b = em.const(np.zeros((static_int(c, "channels"),), dt))
    y = em.node("BatchNormalization", [x, w, b, mean, var], {"epsilon": float(eps), "momentum": 0.9},
                hint=node.name, shape=cv.out_dims(index=0), dtype=dt)
    return (y, None, None)


@handles("_native_batch_norm_legit.no_stats", "_native_batch_norm_legit.default",
         "_native_batch_norm_legit_functional.default")
def _batch_norm_train(cv: Any, node: Any, *args: Any, **kw: Any) -> tuple:
    raise Unsupported("batch norm in training mode (call model.eval() before compiling)")


@handles("convolution.default")
def _conv(cv: Any, node: Any, x: Tensor, w: Tensor, b: Any, stride: list, padding: list, dilation: list,
          transposed: bool, output_padding: list, groups: int) -> Tensor:
    nd = len(cv.shape_of(w)) - 2
    pads = [static_int(p, "conv padding") for p in padding]
    if len(pads) == 1 and nd > 1:
        pads = pads * nd
    attrs: dict[str, Any] = {
        "strides": [static_int(s, "conv stride") for s in stride] or [1] * nd,
        "pads": pads + pads,
        "dilations": [static_int(d, "conv dilation") for d in dilation] or [1] * nd,
        "group": static_int(groups, "conv groups"),
    }
    if len(attrs["strides"]) == 1 and nd > 1:
        attrs["strides"] *= nd
    if len(attrs["dilations"]) == 1 and nd > 1:
        attrs["dilations"] *= nd
    ins = [x, w] + ([b] if b is not None else [])
    if transposed:
        attrs["output_padding"] = [static_int(p, "output_padding") for p in output_padding] or [0] * nd
        return cv.em.node("ConvTranspose", ins, attrs, hint=node.name)
    return cv.em.node("Conv", ins, attrs, hint=node.name)


def _window_attrs(kernel: list, stride: list, padding: list, dilation: list | None, nd: int) -> dict:
    k = [static_int(v, "kernel size") for v in kernel]
    k = k * nd if len(k) == 1 else k
    s = [static_int(v, "stride") for v in stride] or list(k)
    s = s * nd if len(s) == 1 else s
    p = [static_int(v, "padding") for v in padding] or [0] * nd
    p = p * nd if len(p) == 1 else p
    attrs: dict[str, Any] = {"kernel_shape": k, "strides": s, "pads": p + p}
    if dilation:
        d = [static_int(v, "dilation") for v in dilation]
        attrs["dilations"] = d * nd if len(d) == 1 else d
    return attrs


@handles("max_pool2d_with_indices.default", "max_pool1d_with_indices.default", "max_pool3d_with_indices.default",
         "max_pool2d.default", "max_pool1d.default", "max_pool3d.default")
def _max_pool(cv: Any, node: Any, x: Tensor, kernel: list, stride: list = (), padding: list = (0,),
              dilation: list = (1,), ceil_mode: bool = False) -> Any:
    nd = len(cv.shape_of(x)) - 2
    attrs = _window_attrs(list(kernel), list(stride), list(padding), list(dilation), nd)
    attrs["ceil_mode"] = int(bool(ceil_mode))
    y = cv.em.node("MaxPool", [x], attrs, hint=node.name, shape=cv.out_dims(index=0)
                   if "indices" in node.target.__name__ else cv.out_dims(), dtype=cv.dtype_of(x))
    if "indices" in node.target.__name__:
        if uses_output(node, 1):
            raise Unsupported("max_pool's indices output (ONNX indices are laid out differently)")
        return (y, None)
    return y


@handles("avg_pool2d.default", "avg_pool1d.default", "avg_pool3d.default")
def _avg_pool(cv: Any, node: Any, x: Tensor, kernel: list, stride: list = (), padding: list = (0,),
              ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> Tensor:
    if divisor_override is not None:
        raise Unsupported("avg_pool with divisor_override")
    nd = len(cv.shape_of(x)) - 2
    attrs = _window_attrs(list(kernel), list(stride), list(padding), None, nd)
    attrs["ceil_mode"] = int(bool(ceil_mode))
    attrs["count_include_pad"] = int(bool(count_include_pad))
    return cv.em.node("AveragePool", [x], attrs, hint=node.name)


@handles("_adaptive_avg_pool2d.default", "_adaptive_avg_pool1d.default", "adaptive_avg_pool1d.default",
         "_adaptive_avg_pool3d.default", "adaptive_max_pool2d.default", "adaptive_max_pool1d.default")
def _adaptive_pool(cv: Any, node: Any, x: Tensor, output_size: list) -> Any:
    is_max = "max" in node.target.__name__
    shape = cv.shape_of(x)
    spatial = shape[2:]
    outs = [static_int(o, "adaptive pool output size") for o in output_size]
    if is_max and uses_output(node, 1):
        raise Unsupported("adaptive_max_pool's indices output")
    if all(o == 1 for o in outs):
        y = cv.em.node("GlobalMaxPool" if is_max else "GlobalAveragePool", [x], hint=node.name,
                       shape=(*shape[:2], *outs), dtype=cv.dtype_of(x))
    elif all(isinstance(h, int) and h % o == 0 for h, o in zip(spatial, outs)):
        k = [h // o for h, o in zip(spatial, outs)]
        y = cv.em.node("MaxPool" if is_max else "AveragePool", [x], {"kernel_shape": k, "strides": k},
                       hint=node.name, shape=(*shape[:2], *outs), dtype=cv.dtype_of(x))
    else:
        raise Unsupported("adaptive pooling to a size that does not divide the (static) input size")
    return (y, None) if is_max else y


@handles("upsample_nearest2d.default", "upsample_nearest1d.default", "upsample_nearest2d.vec",
         "upsample_bilinear2d.default", "upsample_bilinear2d.vec", "upsample_linear1d.default")
def _upsample(cv: Any, node: Any, x: Tensor, *args: Any) -> Tensor:
    """Resize to the output size torch computed (so the result size never depends on float rounding)."""
    name = node.target.__name__
    linear = "linear" in name
    align = bool(args[1]) if linear and len(args) > 1 and isinstance(args[1], bool) else False
    attrs: dict[str, Any] = {"mode": "linear" if linear else "nearest"}
    if linear:
        attrs["coordinate_transformation_mode"] = "align_corners" if align else "pytorch_half_pixel"
    else:
        attrs["coordinate_transformation_mode"] = "asymmetric"
        attrs["nearest_mode"] = "floor"
    sizes = cv.em.shape_tensor(cv.out_dims())
    return cv.em.node("Resize", [x, None, None, sizes], attrs, hint=node.name)


@handles("lstm.input", "gru.input")
def _rnn(cv: Any, node: Any, x: Tensor, hx: Any, params: list, has_biases: bool, num_layers: int,
         dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> tuple:
    """torch's LSTM / GRU as ONNX LSTM / GRU nodes, one per layer, sequence-major inside.

    Gates are reordered from torch's (i, f, g, o) to ONNX's (i, o, f, c) for LSTM and from (r, z, n) to
    (z, r, h) for GRU (with linear_before_reset=1, torch's GRU); ONNX's B is [W biases, R biases]."""
    from dynshape.frontends.aten import has_op

    op = "LSTM" if node.target.__name__.startswith("lstm") else "GRU"
    if not has_op(op):
        raise Unsupported(f"dynshape has no {op} op yet")
    em = cv.em
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    layers = static_int(num_layers, "num_layers")
    gates_n = 4 if op == "LSTM" else 3
    if any(em.const_value(p) is None for p in params):
        raise Unsupported(f"{op} weights that are not constants")
    w0 = em.const_value(params[0])
    hidden = w0.shape[0] // gates_n
    if len(params) != layers * dirs * per:
        raise Unsupported(f"{op} with projections (proj_size)")
    dt = cv.dtype_of(x)
    order = [0, 3, 1, 2] if op == "LSTM" else [1, 0, 2]

    def gates(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a.reshape(gates_n, hidden, *a.shape[1:])[k] for k in order], axis=0)

    states = list(hx) if op == "LSTM" else [hx]
    out = x if not batch_first else em.node("Transpose", [x], {"perm": [1, 0, 2]}, dtype=dt)
    finals: list[list[Tensor]] = [[] for _ in states]
    attrs: dict[str, Any] = {"hidden_size": hidden, "direction": "bidirectional" if bidirectional else "forward"}
    if op == "GRU":
        attrs["linear_before_reset"] = 1
    for layer in range(layers):
        ws, rs, bs = [], [], []
        for d in range(dirs):
            base = (layer * dirs + d) * per
            ws.append(gates(em.const_value(params[base])))
            rs.append(gates(em.const_value(params[base + 1])))
            if has_biases:
                bias = [gates(em.const_value(params[base + k])) for k in (2, 3)]
                bs.append(np.concatenate(bias))
            else:
                bs.append(np.zeros(2 * gates_n * hidden, dt))
        init = [em.node("Slice", [s, em.ints([layer * dirs]), em.ints([(layer + 1) * dirs]), em.ints([0])], dtype=dt)
                for s in states]
        ins = [out, em.const(np.stack(ws)), em.const(np.stack(rs)), em.const(np.stack(bs)), None, *init]
        res = em.node(op, ins, attrs, n_out=1 + len(states), dtypes=[dt] * (1 + len(states)))
        # Y is (seq, dirs, batch, hidden); the next layer and torch want (seq, batch, dirs * hidden)
        y = em.node("Transpose", [res[0]], {"perm": [0, 2, 1, 3]}, dtype=dt)
        out = em.node("Reshape", [y, em.ints([0, 0, -1])], dtype=dt)
        for k in range(len(states)):
            finals[k].append(res[1 + k])
    y = out if not batch_first else em.node("Transpose", [out], {"perm": [1, 0, 2]}, dtype=dt)
    results = [y] + [f[0] if len(f) == 1 else em.node("Concat", f, {"axis": 0}, dtype=dt) for f in finals]
    for i, t in enumerate(results):
        em.shape[t.name], em.dtype[t.name] = cv.out_dims(index=i), dt
    return tuple(results)


@handles("pixel_shuffle.default")
def _pixel_shuffle(cv: Any, node: Any, x: Tensor, r: int) -> Tensor:
    return cv.em.node("DepthToSpace", [x], {"blocksize": static_int(r, "upscale factor"), "mode": "CRD"},
                      hint=node.name)
