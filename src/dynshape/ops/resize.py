"""Resize and Upsample: every coordinate transformation and interpolation mode of the spec, in float64.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import Layout, register
from dynshape.ops.dims import (
    axis_of,
    ints,
    is_static,
    norm,
    out_type,
    static_shape,
    value_list,
)


# ----------------------------------------------------------------------------------------------------
# Resize, Upsample
# ----------------------------------------------------------------------------------------------------
def _source_coords(ctm: str, y: np.ndarray, scale: float, n_in: int, n_out: int, roi: Any) -> tuple:
    """Output index -> input coordinate for one axis (and, for tf_crop_and_resize, the out-of-input mask)."""
    width = scale * n_in
    if ctm == "align_corners":
        return (np.zeros_like(y) if width == 1 else y * (n_in - 1) / (width - 1)), None
    if ctm == "asymmetric":
        return y / scale, None
    if ctm == "pytorch_half_pixel":
        return (np.full_like(y, -0.5) if width == 1 else (y + 0.5) / scale - 0.5), None
    if ctm == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if ctm == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (y + 0.5) / scale - 0.5, None
    if ctm == "tf_crop_and_resize":
        lo, hi = roi  # numpy scalars of roi's dtype: rounding as in the spec's reference
        if width == 1:
            x = np.full_like(y, (hi - lo) * (n_in - 1) / 2)
        else:
            x = y * (hi - lo) * (n_in - 1) / (width - 1)
        x = x + lo * (n_in - 1)
        return x, (x < 0) | (x > n_in - 1)
    raise ValueError(f"unknown coordinate_transformation_mode {ctm!r}")


def _cubic(r: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic weights of the 4 neighbours at fractional offset r (ONNX's formula, verbatim)."""
    s, t = r + 1, 2 - r
    return np.stack(
        [
            ((a * s - 5 * a) * s + 8 * a) * s - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
            ((a * t - 5 * a) * t + 8 * a) * t - 4 * a,
        ],
        axis=-1,
    )


def _antialias(r: np.ndarray, scale: float, support: int, kernel: Any) -> np.ndarray:
    """Weights of a filter stretched by 1/scale when downsampling, normalised per output position."""
    s = min(scale, 1.0)
    start = int(np.floor(-support / s) + 1)
    args = (np.arange(start, 2 - start)[None, :] - r[:, None]) * s
    w = kernel(np.abs(args))
    return w / w.sum(axis=1, keepdims=True)


def _cubic_kernel(a: float) -> Any:
    def k(x: np.ndarray) -> np.ndarray:
        near = (a + 2) * x**3 - (a + 3) * x**2 + 1
        far = a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a
        return np.where(x <= 1, near, np.where(x < 2, far, 0.0))

    return k


def _weights(mode: str, r: np.ndarray, scale: float, attrs: dict) -> np.ndarray:
    a = float(attrs.get("cubic_coeff_a", -0.75))
    if mode == "linear":
        if attrs.get("antialias", 0):
            return _antialias(r, scale, 1, lambda x: np.clip(1 - x, 0, 1))
        return np.stack([1 - r, r], axis=-1)
    if attrs.get("antialias", 0):
        return _antialias(r, scale, 2, _cubic_kernel(a))
    return _cubic(r, a)


_ROUND = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


def _resize_axis(x: np.ndarray, axis: int, scale: float, n_out: int, roi: Any, attrs: dict) -> np.ndarray:
    """Resize one axis; Resize is separable, so an N-d resize is one call per resized axis."""
    n_in = x.shape[axis]
    coords, outside = _source_coords(attrs["ctm"], np.arange(n_out, dtype=np.float64), scale, n_in, n_out, roi)
    mode = attrs.get("mode", "nearest")
    if mode == "nearest":
        src = np.where(coords == np.floor(coords), coords, _ROUND[attrs["nearest_mode"]](coords))
        y = np.take(x, np.clip(src, 0, n_in - 1).astype(np.intp), axis=axis)
    else:
        base = np.floor(coords)
        r = np.where(coords == base, 1.0, coords - base)  # ONNX prefers the left pixel: r in (0, 1]
        w = _weights(mode, r, scale, attrs)
        n = w.shape[1]
        # the n neighbours nearest to the coordinate, ties to the smaller index (ONNX's _get_neighbor_idxes)
        pw = -(-n // 2)
        p = np.floor(coords + pw)
        frac = coords + pw - p
        if n % 2 == 0:
            off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
        else:
            off = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
        nb = (p + off).astype(np.int64)[:, None] + np.arange(n)[None, :] - pw
        if attrs.get("exclude_outside", 0):
            w = np.where((nb < 0) | (nb >= n_in), 0.0, w)
            total = w.sum(axis=1, keepdims=True)
            w = w / np.where(total == 0, 1.0, total)
        g = np.take(x, np.clip(nb, 0, n_in - 1).astype(np.intp), axis=axis)
        y = (g * w.reshape((1,) * axis + w.shape + (1,) * (x.ndim - axis - 1))).sum(axis=axis + 1)
    if outside is not None and outside.any():
        mask = outside.reshape((1,) * axis + (n_out,) + (1,) * (x.ndim - axis - 1))
        y = np.where(mask, float(attrs.get("extrapolation_value", 0.0)), y)
    return y


def _resize_plan(shape: tuple, scales: list | None, sizes: list | None, axes: list, policy: str) -> tuple:
    """(output sizes, scale factors) for concrete dims, exactly as ONNX computes them."""
    r = len(shape)
    if sizes is not None:
        out = list(shape)
        for a, s in zip(axes, sizes):
            out[a] = int(s)
        factors = [out[i] / shape[i] if shape[i] else 1.0 for i in range(r)]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            k = pick(factors[a] for a in axes)
            factors = [k if i in axes else 1.0 for i in range(r)]
            out = [int(k * shape[i] + 0.5) if i in axes else shape[i] for i in range(r)]
        return out, factors
    factors = [1.0] * r
    for a, s in zip(axes, scales):
        factors[a] = float(s)
    return [_scaled(d, f) for d, f in zip(shape, factors)], factors


def _scaled(d: Any, scale: float) -> Any:
    """floor(d * scale), exact: the float scale is an exact binary fraction p/q, so this is (d*p)//q."""
    f = Fraction(scale)
    return (norm(d) * f.numerator) // f.denominator


def _resize_args(inputs: list, opset: int) -> tuple:
    """(roi, scales, sizes) by position; Resize-10 and Upsample-9 have only X, scales."""
    if opset < 11:
        return None, inputs[1], None

    def get(i: int) -> Any:
        v = inputs[i] if len(inputs) > i else None
        return None if v is None or v.size == 0 else v

    return get(1), get(2), get(3)


def _resize_ref(inputs: list, attrs: dict) -> list:
    x, opset = inputs[0], attrs.get("_opset", 19)
    roi, scales, sizes = _resize_args(inputs, opset)
    axes = attrs.get("axes")
    axes = list(range(x.ndim)) if axes is None else [axis_of(a, x.ndim) for a in axes]
    old = opset < 11
    attrs = {
        **attrs,
        "ctm": "asymmetric" if old else attrs.get("coordinate_transformation_mode", "half_pixel"),
        "nearest_mode": "floor" if old else attrs.get("nearest_mode", "round_prefer_floor"),
    }
    out, factors = _resize_plan(
        x.shape,
        None if scales is None else scales.tolist(),
        None if sizes is None else ints(sizes),
        axes,
        attrs.get("keep_aspect_ratio_policy", "stretch"),
    )
    if x.size == 0 or 0 in out:  # nothing to interpolate from, or nothing to produce
        return [np.zeros(out, x.dtype)]
    roi = None if roi is None else np.asarray(roi).reshape(-1)
    y = x.astype(np.float64)
    for i, a in enumerate(axes):
        lohi = None if roi is None else (roi[i], roi[len(axes) + i])
        identity = math.isclose(factors[a], 1.0) and out[a] == y.shape[a]
        if identity and (lohi is None or (math.isclose(lohi[0], 0.0) and math.isclose(lohi[1], 1.0))):
            continue
        y = _resize_axis(y, a, factors[a], out[a], lohi, attrs)
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        y = np.clip(np.round(y), info.min, info.max)
    return [y.astype(x.dtype)]


_STRING_ATTRS = {
    "mode": ("nearest", "linear", "cubic", "bilinear", "trilinear"),  # bilinear/trilinear: Upsample-7
    "coordinate_transformation_mode": ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                                       "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"),
    "nearest_mode": ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"),
    "keep_aspect_ratio_policy": ("stretch", "not_larger", "not_smaller"),
}


def _resize_infer(ctx: InferCtx) -> list:
    for name, allowed in _STRING_ATTRS.items():  # an unknown mode would otherwise run as some default one
        v = ctx.attr(name, None)
        if v is not None and v not in allowed:
            ctx.error(f"{name} {v!r} is not one of {', '.join(allowed)}")
    x = ctx.inputs[0]
    idx = (1, None) if ctx.opset < 11 else (2, 3)
    axes = ctx.attr("axes", None)
    axes = list(range(x.rank)) if axes is None else [axis_of(a, x.rank) for a in axes]
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    shape = list(x.shape)

    def param(i: int | None) -> tuple[bool, list | None]:
        t = ctx.inputs[i] if i is not None and len(ctx.inputs) > i else None
        if t is None or (t.shape and is_static(t.shape[0]) and t.shape[0] == 0):
            return False, None
        if t.shape is not None and len(t.shape) != 1:
            ctx.error(f"input {i} ({'scales' if i == idx[0] else 'sizes'}) must be 1-D; it has shape {list(t.shape)}")
        return True, value_list(t)

    (has_scales, scales), (has_sizes, sizes) = param(idx[0]), param(idx[1])
    if ctx.opset < 9 and ctx.op_type == "Upsample":
        has_scales, scales = True, list(ctx.attr("scales", []))
    if has_scales == has_sizes:
        ctx.error("give exactly one of scales and sizes (non-empty), not " + ("both" if has_scales else "neither"))
    n = len(axes)
    for what, v in (("scales", scales), ("sizes", sizes)):
        if v is not None and len(v) != n:
            ctx.error(f"{what} has {len(v)} entries; the resized axes are {n}")
    if scales is not None and any(isinstance(s, float) and not s > 0 for s in scales):
        ctx.error(f"scales {scales} must all be > 0")
    if sizes is not None and any(is_static(s) and s < 0 for s in sizes):
        ctx.error(f"sizes {sizes} must all be >= 0")
    if has_sizes and sizes is not None and policy == "stretch":
        for a, s in zip(axes, sizes):
            shape[a] = s
    elif has_sizes and sizes is not None and static_shape(shape) and all(is_static(s) for s in sizes):
        shape = _resize_plan(tuple(shape), None, sizes, axes, policy)[0]
    elif not has_sizes and has_scales and scales is not None:
        for a, s in zip(axes, scales):
            shape[a] = _scaled(shape[a], float(s))
    else:
        for a in axes:
            shape[a] = ctx.fresh("resize")
    return [out_type(x.dtype, shape)]


register("Resize", reference=_resize_ref, infer=_resize_infer, layout=Layout.SPATIAL)


def _upsample_ref(inputs: list, attrs: dict) -> list:
    scales = np.asarray(attrs["scales"], dtype=np.float32) if attrs.get("_opset", 9) < 9 else inputs[1]
    return _resize_ref([inputs[0], scales], {**attrs, "_opset": 10})


register("Upsample", reference=_upsample_ref, infer=_resize_infer, layout=Layout.SPATIAL)
