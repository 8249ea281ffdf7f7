"""Convolution and pooling: numpy references (im2col + matmul) and exact symbolic output-size rules.

Output sizes are the integer formulas ONNX specifies, written once over `int | Expr`:
`(H + pad_begin + pad_end - dilation*(k - 1) - 1) // stride + 1`, a ceil_div variant for ceil_mode (the last
window must start inside the input or its begin padding), and `ceil_div(H, stride)` for SAME_* auto_pad.
The references are the oracle for compiled backends, so they are vectorised (strided window views + one
batched matmul per op), never per-pixel Python loops.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import Layout, PoolKind, register
from dynshape.ops.dims import ceil_div, dmax, dmin, is_static, norm, out_type
from dynshape.sym import Cond, le, min_

I64 = np.dtype(np.int64)


# ----------------------------------------------------------------------------------------------------
# geometry, shared by the shape rules and the references
# ----------------------------------------------------------------------------------------------------
def window_params(get: Any, nd: int) -> tuple[list, list, list, list, str]:
    """(strides, dilations, pads_begin, pads_end, auto_pad) with ONNX defaults."""
    strides = list(get("strides", None) or [1] * nd)
    dilations = list(get("dilations", None) or [1] * nd)
    pads = list(get("pads", None) or [0] * (2 * nd))
    auto_pad = get("auto_pad", "NOTSET") or "NOTSET"
    return strides, dilations, pads[:nd], pads[nd:], auto_pad


def window_out(h: Any, k: Any, s: int, d: int, pb: Any, pe: Any, auto_pad: str, ceil_mode: bool) -> tuple:
    """(output size, effective begin pad) of one sliding-window axis, over `int | Expr`.

    ceil_mode counts window starts t*s with t <= ceil((H + pads - span) / s) that lie inside the input or its
    begin padding (t*s < H + pad_begin): `min(ceil_div(X, s), (H + pb - 1) // s) + 1`, exact for every H.
    """
    span = d * (k - 1) + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        o = ceil_div(h, s)
        # never negative (TensorFlow's SAME, onnxruntime's Conv): when span < stride the last window ends early
        total = dmax((o - 1) * s + span - h, 0)
        return o, (total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
    if auto_pad == "VALID":
        pb, pe = 0, 0
    x = h + pb + pe - span
    if not ceil_mode:
        return x // s + 1, pb
    return dmin(ceil_div(x, s), (h + pb - 1) // s) + 1, pb


def _geometry(get: Any, spatial: tuple, kernel: list, ceil_mode: bool = False) -> tuple[list, list]:
    strides, dilations, pbs, pes, auto_pad = window_params(get, len(spatial))
    outs, begins = [], []
    for h, k, s, d, pb, pe in zip(spatial, kernel, strides, dilations, pbs, pes):
        o, b = window_out(h, norm(k), int(s), int(d), pb, pe, auto_pad, ceil_mode)
        outs.append(o)
        begins.append(b)
    return outs, begins


def check_window_attrs(ctx: InferCtx, nd: int, kernel: list | None = None) -> None:
    """The attributes the output-size formulas rely on, each a ShapeError naming the node when wrong: one stride,
    dilation and kernel entry per spatial axis, strides and dilations >= 1, kernel sizes >= 1, 2*nd pads >= 0
    (onnxruntime refuses negative Conv / pool pads), a known auto_pad."""
    for name in ("strides", "dilations", "kernel_shape"):
        v = ctx.attr(name, None)
        if v is None:
            continue
        if len(v) != nd:
            ctx.error(f"{name} {list(v)} has {len(v)} entries; the input has {nd} spatial axes")
        if any(int(x) < 1 for x in v):
            ctx.error(f"{name} {list(v)} must be >= 1 on every axis")
    pads = ctx.attr("pads", None)
    if pads is not None:
        if len(pads) != 2 * nd:
            ctx.error(f"pads {list(pads)} has {len(pads)} entries; {nd} spatial axes need {2 * nd} (begins, then ends)")
        if any(int(x) < 0 for x in pads):
            ctx.error(f"pads {list(pads)} must be >= 0")
        given = ctx.attr("kernel_shape", None)
        if ctx.op_type in ("MaxPool", "AveragePool", "LpPool") and given is not None and len(given) == nd:
            k2 = list(given) * 2
            if any(int(p) >= int(k) for p, k in zip(pads, k2)):  # a window of padding only: onnxruntime refuses
                ctx.error(f"pads {list(pads)} must be smaller than kernel_shape {list(given)}")
    auto_pad = ctx.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        ctx.error(f"auto_pad {auto_pad!r} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
    given = ctx.attr("kernel_shape", None)
    if kernel is not None and given is not None:
        for ax, (a, b) in enumerate(zip(given, kernel)):
            if is_static(b) and int(a) != b:
                ctx.error(f"kernel_shape {list(given)} disagrees with the weights' spatial shape "
                          f"{[norm(k) for k in kernel]} (axis {ax})")


def _check_out(ctx: InferCtx, outs: list, spatial: tuple = (), at_zero: list | None = None) -> None:
    """Every output spatial size is >= 1, or 0 from an empty input axis whose padding yields an empty output.

    A static size < 1 is an error now. A symbolic one is a requirement recorded against the input's symbols
    (`ctx.require`), so a resolution smaller than the window's receptive field after padding (H < kernel) is
    refused per call, before anything runs, naming the input, its axis, the symbol and this fact; where the
    requirement is a bound on one symbol it refines that symbol's declared range (`H in [3, inf]`)."""
    node = getattr(ctx, "node", None)  # the input's name, for the message (InferCtx has the node)
    x = node.inputs[0] if node is not None and node.inputs else "X"
    for ax, o in enumerate(outs):
        h = spatial[ax] if ax < len(spatial) else None
        if is_static(o):
            if o < 1 and not (o == 0 and h is not None and is_static(h) and h == 0):
                ctx.error(f"output spatial size {o} < 1 on axis {ax + 2}: the window is larger than the padded "
                          "input")
            continue
        if h is None:
            continue
        o0 = at_zero[ax] if at_zero is not None and ax < len(at_zero) else None
        strict = is_static(o0) and o0 < 0  # an empty axis gives a negative size too: 1 is the bound
        cond = le(1, o) if strict else le(min_(h, 1), o)
        text = (f"{o} >= 1{'' if strict else ' or axis empty'}: input {x!r} axis {ax + 2} ({h}), padded, covers the "
                f"{ctx.op_type} window")
        ctx.require(Cond(cond.kind, cond.expr, text, cond.k),
                    fix=f"feed input {x!r} with axis {ax + 2} at least as large as the window after padding, or "
                        f"declare that dim's min so (dims=...)")


def _at_zero(geometry: Any, get: Any, nd: int, kernel: list, *extra: Any) -> list | None:
    """The output sizes the same geometry gives an empty input (numbers when the kernel is static)."""
    if not all(is_static(norm(k)) for k in kernel):
        return None
    try:
        return list(geometry(get, (0,) * nd, [norm(k) for k in kernel], *extra)[0])
    except Exception:  # noqa: BLE001 - malformed attributes: check_window_attrs reports them
        return None


def windows(
    x: np.ndarray, kernel: list, strides: list, dilations: list, begins: list, outs: list, fill: Any
) -> np.ndarray:
    """View (N, C, *out, *kernel) of every window of `x`, padded with `fill` where windows leave the input."""
    nd = len(kernel)
    if any(o <= 0 for o in outs):  # no window fits (an empty or too short axis): an empty view
        return np.full((*x.shape[:2], *[max(o, 0) for o in outs], *kernel), fill, dtype=x.dtype)
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    width = [(0, 0), (0, 0)]
    for h, o, s, sp, b in zip(x.shape[2:], outs, strides, spans, begins):
        need = (o - 1) * s + sp  # padded length the last window reaches
        width.append((max(b, 0), max(need - h - b, 0)))
    xp = np.pad(x, width, mode="constant", constant_values=fill)
    xp = xp[(slice(None), slice(None), *[slice(max(-b, 0), None) for b in begins])]  # negative pads crop
    v = sliding_window_view(xp, spans, axis=tuple(range(2, 2 + nd)))
    index = [slice(None), slice(None)]
    index += [slice(0, (o - 1) * s + 1, s) for o, s in zip(outs, strides)]
    index += [slice(None, None, d) for d in dilations]
    return v[tuple(index)]


def _float_work(x: np.ndarray) -> np.dtype:
    """Accumulate half-precision types in float32 (what every real kernel does), others natively."""
    half = x.dtype.kind == "V" or (x.dtype.kind == "f" and x.dtype.itemsize < 4)  # ml_dtypes are kind "V"
    return np.dtype(np.float32) if half else x.dtype


# ----------------------------------------------------------------------------------------------------
# Conv
# ----------------------------------------------------------------------------------------------------
def _conv_ref(inputs: list, attrs: dict) -> list:
    x, w = inputs[:2]
    b = inputs[2] if len(inputs) > 2 else None
    g = int(attrs.get("group", 1))
    kernel = list(w.shape[2:])
    outs, begins = _geometry(attrs.get, x.shape[2:], kernel)
    strides, dilations = window_params(attrs.get, len(kernel))[:2]
    work = _float_work(x)
    v = windows(x.astype(work), kernel, strides, dilations, begins, outs, 0)
    n, c = x.shape[:2]
    m, cg, p, kf = w.shape[0], c // g, int(np.prod(outs)), int(np.prod(kernel))
    cols = v.reshape(n, g, cg, p, kf).transpose(1, 0, 3, 2, 4).reshape(g, n * p, cg * kf)
    y = np.matmul(cols, w.astype(work).reshape(g, m // g, cg * kf).transpose(0, 2, 1))  # (g, n*p, m/g)
    y = y.reshape(g, n, p, m // g).transpose(1, 0, 3, 2).reshape(n, m, *outs)
    if b is not None:
        y = y + b.astype(work).reshape(1, m, *[1] * len(kernel))
    return [y.astype(x.dtype)]


def _conv_infer(ctx: InferCtx) -> list:
    x, w = ctx.inputs[:2]
    b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    g = int(ctx.attr("group", 1))
    if g < 1:
        ctx.error(f"group {g} must be >= 1")
    if x.rank != w.rank or x.rank < 3:
        ctx.error(f"input rank {x.rank} and weight rank {w.rank} must match and be >= 3")
    ctx.unify(x.shape[1], w.shape[1] * g)
    check_window_attrs(ctx, x.rank - 2, list(w.shape[2:]))
    kernel = ctx.attr("kernel_shape", None) or list(w.shape[2:])  # may be symbolic: the formulas hold
    if b is not None:
        if len(b.shape) != 1:
            ctx.error(f"bias must be 1-D (one value per output channel), it has shape {list(b.shape)}")
        ctx.unify(b.shape[0], w.shape[0])
    outs = _geometry(ctx.attr, x.shape[2:], [norm(k) for k in kernel])[0]
    _check_out(ctx, outs, x.shape[2:], _at_zero(_geometry, ctx.attr, x.rank - 2, kernel))
    return [out_type(x.dtype, (x.shape[0], w.shape[0], *outs))]


register("Conv", reference=_conv_ref, infer=_conv_infer, layout=Layout.SPATIAL)


# ----------------------------------------------------------------------------------------------------
# ConvTranspose
# ----------------------------------------------------------------------------------------------------
def _transpose_geometry(get: Any, spatial: tuple, kernel: list) -> tuple[list, list]:
    """(output sizes, begin pads): explicit pads, output_shape (pads derived) or SAME_* (output = H * stride)."""
    nd = len(spatial)
    strides, dilations, pbs, pes, auto_pad = window_params(get, nd)
    ops = list(get("output_padding", None) or [0] * nd)
    target = get("output_shape", None)
    target = None if target is None else list(target)[-nd:]
    outs, begins = [], []
    for i, h in enumerate(spatial):
        full = strides[i] * (h - 1) + ops[i] + dilations[i] * (kernel[i] - 1) + 1
        if target is None and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
            outs.append(full - pbs[i] - pes[i])
            begins.append(pbs[i])
            continue
        o = h * strides[i] if target is None else target[i]
        total = full - o
        outs.append(o)
        begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
    return outs, begins


def _conv_transpose_ref(inputs: list, attrs: dict) -> list:
    x, w = inputs[:2]
    b = inputs[2] if len(inputs) > 2 else None
    g = int(attrs.get("group", 1))
    kernel = list(w.shape[2:])
    nd = len(kernel)
    strides, dilations = window_params(attrs.get, nd)[:2]
    outs, begins = _transpose_geometry(attrs.get, x.shape[2:], kernel)
    work = _float_work(x)
    n, c, ins = x.shape[0], x.shape[1], list(x.shape[2:])
    cg, mg, p = c // g, w.shape[1], int(np.prod(ins))
    cols = x.astype(work).reshape(n, g, cg, p).transpose(1, 0, 3, 2)  # (g, n, p, cg)
    cols = np.matmul(cols, w.astype(work).reshape(g, 1, cg, -1))  # (g, n, p, mg*K)
    cols = cols.reshape(g, n, *ins, mg, *kernel)
    cols = np.moveaxis(cols, 2 + nd, 2).reshape(g, n, mg, *ins, *kernel)
    full = [s * (h - 1) + d * (k - 1) + 1 for h, k, s, d in zip(ins, kernel, strides, dilations)]
    y = np.zeros((g, n, mg, *full), dtype=work)
    for kk in itertools.product(*[range(k) for k in kernel]):  # col2im: one strided add per kernel tap
        dst = tuple(slice(k * d, k * d + (h - 1) * s + 1, s) for k, d, h, s in zip(kk, dilations, ins, strides))
        y[(slice(None), slice(None), slice(None), *dst)] += cols[(Ellipsis, *kk)]
    y = np.moveaxis(y, 0, 1).reshape(n, g * mg, *full)
    out = np.zeros((n, g * mg, *outs), dtype=work)  # crop by begin pads; the rest (output_padding) stays 0
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for o, f, pb in zip(outs, full, begins):
        lo, hi = max(pb, 0), min(pb + o, f)
        src.append(slice(lo, max(hi, lo)))
        dst.append(slice(lo - pb, lo - pb + max(hi - lo, 0)))
    out[tuple(dst)] = y[tuple(src)]
    if b is not None:
        out = out + b.astype(work).reshape(1, -1, *[1] * nd)
    return [out.astype(x.dtype)]


def _conv_transpose_infer(ctx: InferCtx) -> list:
    x, w = ctx.inputs[:2]
    b = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    g = int(ctx.attr("group", 1))
    if g < 1:
        ctx.error(f"group {g} must be >= 1")
    if x.rank != w.rank or x.rank < 3:
        ctx.error(f"input rank {x.rank} and weight rank {w.rank} must match and be >= 3")
    ctx.unify(x.shape[1], w.shape[0])
    check_window_attrs(ctx, x.rank - 2, list(w.shape[2:]))
    kernel = ctx.attr("kernel_shape", None) or list(w.shape[2:])
    m = w.shape[1] * g
    if b is not None:
        if len(b.shape) != 1:
            ctx.error(f"bias must be 1-D (one value per output channel), it has shape {list(b.shape)}")
        ctx.unify(b.shape[0], m)
    outs = _transpose_geometry(ctx.attr, x.shape[2:], [norm(k) for k in kernel])[0]
    _check_out(ctx, outs, x.shape[2:], _at_zero(_transpose_geometry, ctx.attr, x.rank - 2, kernel))
    return [out_type(x.dtype, (x.shape[0], m, *outs))]


register("ConvTranspose", reference=_conv_transpose_ref, infer=_conv_transpose_infer, layout=Layout.SPATIAL)


# ----------------------------------------------------------------------------------------------------
# pooling
# ----------------------------------------------------------------------------------------------------
def _pool_setup(x: np.ndarray, attrs: dict) -> tuple:
    kernel = [int(k) for k in attrs["kernel_shape"]]
    strides, dilations = window_params(attrs.get, len(kernel))[:2]
    outs, begins = _geometry(attrs.get, x.shape[2:], kernel, bool(attrs.get("ceil_mode", 0)))
    return kernel, strides, dilations, outs, begins


def _flat_windows(x: np.ndarray, geo: tuple, fill: Any) -> np.ndarray:
    """(N, C, *out, prod(kernel)) window contents."""
    v = windows(x, *geo[:3], geo[4], geo[3], fill)
    return v.reshape(*v.shape[: 2 + len(geo[0])], int(np.prod(geo[0])))  # explicit: -1 fails on 0 elements


def _max_pool_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    geo = _pool_setup(x, attrs)
    kernel, strides, dilations, outs, begins = geo
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    v = _flat_windows(x, geo, low)
    arg = np.argmax(v, axis=-1)  # first maximum in row-major window order, as ONNX does
    y = np.take_along_axis(v, arg[..., None], axis=-1)[..., 0]
    if attrs.get("_num_outputs", 2) < 2:
        return [y]
    # window tap -> input coordinates -> flat index into the whole input (row- or column-major spatial part)
    nd, spatial = len(kernel), x.shape[2:]
    taps = np.unravel_index(arg, kernel)
    if attrs.get("storage_order", 0):
        steps = [int(np.prod(spatial[:i])) for i in range(nd)]
    else:
        steps = [int(np.prod(spatial[i + 1 :])) for i in range(nd)]
    flat = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[:2] + (1,) * nd) * int(np.prod(spatial))
    for i in range(nd):
        start = np.arange(outs[i]).reshape([-1 if j == i else 1 for j in range(nd)]) * strides[i] - begins[i]
        flat = flat + (start + taps[i] * dilations[i]) * steps[i]
    return [y, flat.astype(np.int64)]


def _counted_pads(x: np.ndarray, attrs: dict, geo: tuple) -> list[tuple[int, int]]:
    """(begin, end) padding whose zeros an average with count_include_pad counts: explicit or SAME_* pads."""
    kernel, strides, dilations, outs, begins = geo
    auto_pad = attrs.get("auto_pad", "NOTSET") or "NOTSET"
    nd = len(kernel)
    if auto_pad == "NOTSET":
        pads = list(attrs.get("pads", None) or [0] * 2 * nd)
        return list(zip(pads[:nd], pads[nd:]))
    if auto_pad == "VALID":
        return [(0, 0)] * nd
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    return [(b, max((o - 1) * s + sp - h, 0) - b) for h, o, s, sp, b in zip(x.shape[2:], outs, strides, spans, begins)]


def _avg_pool_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    geo = _pool_setup(x, attrs)
    work = _float_work(x)
    total = _flat_windows(x.astype(work), geo, 0).sum(axis=-1)
    # divisor: taps inside the input, or (count_include_pad) inside input + pads; never ceil_mode's overhang
    inside = np.ones((1, 1, *x.shape[2:]), dtype=work)
    if attrs.get("count_include_pad", 0):
        pads = _counted_pads(x, attrs, geo)
        inside = np.pad(inside, [(0, 0), (0, 0), *pads], constant_values=1)
        geo = (*geo[:4], [b - p for b, (p, _) in zip(geo[4], pads)])
    count = _flat_windows(inside, geo, 0).sum(axis=-1)
    return [(total / count).astype(x.dtype)]


def _lp_pool_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    p = float(attrs.get("p", 2))
    work = _float_work(x)
    v = _flat_windows(np.abs(x.astype(work)), _pool_setup(x, attrs), 0)
    return [((v**p).sum(axis=-1) ** (1.0 / p)).astype(x.dtype)]


def _pool_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    kernel = [int(k) for k in ctx.attr("kernel_shape", None) or []]
    if len(kernel) != x.rank - 2:
        ctx.error(f"kernel_shape {kernel} does not match input rank {x.rank}")
    check_window_attrs(ctx, x.rank - 2)
    ceil = bool(ctx.attr("ceil_mode", 0))
    outs = _geometry(ctx.attr, x.shape[2:], kernel, ceil)[0]
    _check_out(ctx, outs, x.shape[2:], _at_zero(_geometry, ctx.attr, x.rank - 2, kernel, ceil))
    shape = (*x.shape[:2], *outs)
    types = [out_type(x.dtype, shape)]
    if ctx.op_type == "MaxPool" and ctx.num_outputs > 1:
        types.append(out_type(I64, shape))
    return types


register("MaxPool", reference=_max_pool_ref, infer=_pool_infer, layout=Layout.SPATIAL,
         pool=PoolKind.MAX)
register("AveragePool", reference=_avg_pool_ref, infer=_pool_infer, layout=Layout.SPATIAL,
         pool=PoolKind.AVERAGE)
register("LpPool", reference=_lp_pool_ref, infer=_pool_infer, layout=Layout.SPATIAL,
         pool=PoolKind.LP)


def _global_ref(fn: Any) -> Any:
    def ref(inputs: list, attrs: dict) -> list:
        x = inputs[0]
        return [fn(x, axis=tuple(range(2, x.ndim)), keepdims=True).astype(x.dtype)]

    return ref


def _global_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    return [out_type(x.dtype, (*x.shape[:2], *[1] * (x.rank - 2)))]


register("GlobalAveragePool", reference=_global_ref(np.mean), infer=_global_infer, layout=Layout.SPATIAL,
         pool=PoolKind.AVERAGE, global_pool=True)
register("GlobalMaxPool", reference=_global_ref(np.max), infer=_global_infer, layout=Layout.SPATIAL,
         pool=PoolKind.MAX, global_pool=True)


def _global_lp(inputs: list, attrs: dict) -> list:
    x, p = inputs[0], float(attrs.get("p", 2))
    axes = tuple(range(2, x.ndim))
    return [((np.abs(x) ** p).sum(axis=axes, keepdims=True) ** (1.0 / p)).astype(x.dtype)]


register("GlobalLpPool", reference=_global_lp, infer=_global_infer, layout=Layout.SPATIAL,
         pool=PoolKind.LP, global_pool=True)
