"""Vision ops: GridSample, AffineGrid, RoiAlign, MaxRoiPool, NonMaxSuppression, CenterCropPad.

Sampling is vectorised over every output point at once (one gather per interpolation tap), with ONNX's edge
rules spelled out once in `sample`: a coordinate outside the sampling borders is first clamped (border) or
reflected (reflection), then each tap outside the input reads 0 (zeros), the nearest edge pixel (border) or its
mirror (reflection). DeformConv (ops/windowed.py) samples through the same function. Sizes that depend on data
(the boxes NonMaxSuppression keeps) are fresh dims; sizes read from a shape input are exact when its value is
known and fresh otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType
from dynshape.ops import dtypes as dt
from dynshape.ops.dims import arg_value, is_static, norm

I64 = np.dtype(np.int64)
CUBIC_A = -0.75  # Keys' cubic convolution, as GridSample (and PyTorch's bicubic) use it


# ---------------------------------------------------------------------------------------------------------
# interpolation, shared by GridSample and DeformConv
# ---------------------------------------------------------------------------------------------------------
def _reflect(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect coordinates at the borders until they fall inside [lo, hi]."""
    span = hi - lo
    if span <= 0:
        return np.full_like(v, lo)
    below, above = v < lo, v > hi
    d = np.where(below, lo - v, np.where(above, v - hi, 0.0))
    n = np.floor(d / span)
    r = d - n * span
    even = (n % 2) == 0
    out = np.where(below, np.where(even, lo + r, hi - r), v)
    return np.where(above, np.where(even, hi - r, lo + r), out)


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    a = CUBIC_A
    w0 = ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a
    w1 = ((a + 2) * t - (a + 3)) * t * t + 1
    w2 = ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1
    w3 = ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a
    return [w0, w1, w2, w3]


def sample(x: np.ndarray, coords: list[np.ndarray], mode: str, padding: str, align_corners: bool) -> np.ndarray:
    """Interpolate x (N, C, *D) at pixel coordinates (one (N, *out) array per spatial axis) -> (N, C, *out)."""
    dims = x.shape[2:]
    work = np.float64 if x.dtype == np.float64 else np.float32
    lows = [0.0 if align_corners else -0.5 for _ in dims]
    highs = [d - 1.0 if align_corners else d - 0.5 for d in dims]
    coords = [np.asarray(c, work) for c in coords]
    if mode == "nearest":
        coords = [np.rint(c) for c in coords]
    if padding == "border":
        coords = [np.where((c < lo) | (c > hi), np.clip(c, 0, d - 1), c) for c, lo, hi, d in
                  zip(coords, lows, highs, dims)]
    elif padding == "reflection":
        coords = [_reflect(c, lo, hi) for c, lo, hi in zip(coords, lows, highs)]
    taps: list[list[tuple[np.ndarray, Any]]] = []  # per axis: (index, weight) pairs
    for c in coords:
        if mode == "nearest":
            taps.append([(np.trunc(c).astype(np.int64), 1.0)])
            continue
        f = np.floor(c)
        t = c - f
        base = f.astype(np.int64)
        if mode == "cubic":
            taps.append([(base + k - 1, w) for k, w in enumerate(_cubic_weights(t))])
        else:
            taps.append([(base, 1 - t), (base + 1, t)])
    n_idx = np.arange(x.shape[0]).reshape((-1,) + (1,) * (coords[0].ndim - 1)) if coords else None
    xf = x.astype(work)
    out = 0
    for combo in np.ndindex(*[len(t) for t in taps]):
        weight: Any = 1.0
        index = []
        valid: Any = True
        for axis, k in enumerate(combo):
            i, w = taps[axis][k]
            weight = weight * w
            i, ok = _tap(i, dims[axis], padding, lows[axis], highs[axis])
            valid = valid & ok
            index.append(i)
        v = xf[(n_idx, slice(None), *index)]  # (N, *out, C)
        v = np.moveaxis(v, -1, 1)
        w = np.asarray(weight if valid is True else np.where(valid, weight, 0.0))
        out = out + v * (w[:, None] if w.ndim else w)
    return np.asarray(out)


def _tap(i: np.ndarray, d: int, padding: str, lo: float, hi: float) -> tuple[np.ndarray, Any]:
    """A tap's index made safe to gather, and whether it reads the input (False: it reads 0)."""
    if padding == "zeros":
        ok = (i >= 0) & (i < d)
        return np.clip(i, 0, max(d - 1, 0)), ok
    if padding == "reflection":
        i = np.trunc(_reflect(i.astype(np.float64), lo, hi)).astype(np.int64)
    return np.clip(i, 0, max(d - 1, 0)), True


# ---------------------------------------------------------------------------------------------------------
# GridSample / AffineGrid
# ---------------------------------------------------------------------------------------------------------
_MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic", "nearest": "nearest"}


def _denormalize(g: np.ndarray, d: int, align: bool) -> np.ndarray:
    return (g + 1) / 2 * (d - 1) if align else ((g + 1) * d - 1) / 2


def _grid_sample_ref(inputs: list, attrs: dict) -> list:
    x, grid = inputs
    mode = _MODES[attrs.get("mode", "linear" if attrs.get("_opset", 22) >= 20 else "bilinear")]
    align = bool(attrs.get("align_corners", 0))
    dims = x.shape[2:]
    r = len(dims)
    g = grid.astype(np.float64 if grid.dtype == np.float64 else np.float32)
    coords = [_denormalize(g[..., r - 1 - axis], dims[axis], align) for axis in range(r)]  # grid is (x, y, ...)
    if x.size == 0 or grid.size == 0:
        return [np.zeros((x.shape[0], x.shape[1], *grid.shape[1:-1]), x.dtype)]
    y = sample(x, coords, mode, attrs.get("padding_mode", "zeros"), align)
    return [dt.cast(y, x.dtype) if dt.is_float(x.dtype) else y.astype(x.dtype)]


def _grid_sample_rule(ctx: InferCtx) -> list[TensorType]:
    x, grid = ctx.inputs
    mode = ctx.attr("mode", "linear")
    if mode not in _MODES:
        ctx.error(f"mode must be one of linear, nearest, cubic, got {mode!r}")
    if ctx.attr("padding_mode", "zeros") not in ("zeros", "border", "reflection"):
        ctx.error(f"padding_mode must be zeros, border or reflection, got {ctx.attr('padding_mode')!r}")
    r = x.rank - 2
    if r < 1 or grid.rank != r + 2:
        ctx.error(f"X (N, C, D1..Dr) and grid (N, D1_out..Dr_out, r) disagree: {x.shape} and {grid.shape}")
    ctx.unify(grid.shape[-1], r)
    n = ctx.unify(x.shape[0], grid.shape[0])
    return [TensorType(x.dtype, (n, x.shape[1], *grid.shape[1:-1]))]


register("GridSample", reference=_grid_sample_ref, infer=_grid_sample_rule)


def _base_coords(n: int, align: bool) -> np.ndarray:
    if align:
        return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(n)
    return (2 * np.arange(n) + 1) / n - 1


def _affine_grid_ref(inputs: list, attrs: dict) -> list:
    theta, size = inputs
    size = [int(v) for v in size]
    spatial = size[2:]
    r = len(spatial)
    align = bool(attrs.get("align_corners", 0))
    axes = [_base_coords(d, align) for d in spatial]  # D, H, W order
    mesh = np.meshgrid(*axes, indexing="ij")
    base = np.stack([*[mesh[r - 1 - k] for k in range(r)], np.ones(mesh[0].shape)], axis=-1)  # (x, y[, z], 1)
    t = theta.astype(np.float64)
    grid = np.einsum("...k,njk->n...j", base, t)
    return [grid.astype(theta.dtype)]


def _affine_grid_rule(ctx: InferCtx) -> list[TensorType]:
    theta, size = ctx.inputs
    if theta.rank != 3:
        ctx.error(f"theta must be (N, 2, 3) or (N, 3, 4), got {theta.shape}")
    if size.rank != 1:
        ctx.error(f"size must be 1-D, got {size.shape}")
    k = ctx.static(size.shape[0], "the length of size")
    if k not in (4, 5):
        ctx.error(f"size must hold (N, C, H, W) or (N, C, D, H, W), got {k} values")
    r = k - 2
    ctx.unify(theta.shape[1], r)
    ctx.unify(theta.shape[2], r + 1)
    vals = arg_value(ctx, 1)
    spatial = [norm(v) for v in vals[2:]] if vals is not None else [ctx.fresh("affine_grid") for _ in range(r)]
    n = theta.shape[0] if vals is None else ctx.unify(theta.shape[0], vals[0])
    return [TensorType(theta.dtype, (n, *spatial, r))]


register("AffineGrid", reference=_affine_grid_ref, infer=_affine_grid_rule)


# ---------------------------------------------------------------------------------------------------------
# RoiAlign / MaxRoiPool
# ---------------------------------------------------------------------------------------------------------
def _roi_bilinear(plane: np.ndarray, y: np.ndarray, x: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(value, weight) of the 4 taps at each (y, x), onnxruntime's edge rules (outside [-1, H] reads 0)."""
    h, w = plane.shape[-2:]
    out = (y < -1.0) | (y > h) | (x < -1.0) | (x > w)
    y, x = np.maximum(y, 0), np.maximum(x, 0)
    y0, x0 = y.astype(np.int64), x.astype(np.int64)
    ytop, xtop = y0 >= h - 1, x0 >= w - 1
    y0, x0 = np.where(ytop, h - 1, y0), np.where(xtop, w - 1, x0)
    y1, x1 = np.where(ytop, h - 1, y0 + 1), np.where(xtop, w - 1, x0 + 1)
    y, x = np.where(ytop, y0, y), np.where(xtop, x0, x)
    ly, lx = y - y0, x - x0
    hy, hx = 1 - ly, 1 - lx
    taps = []
    for yy, xx, wt in ((y0, x0, hy * hx), (y0, x1, hy * lx), (y1, x0, ly * hx), (y1, x1, ly * lx)):
        taps.append((plane[:, yy, xx], np.where(out, 0.0, wt)))
    return taps


def _roi_align_ref(inputs: list, attrs: dict) -> list:
    x, rois, batch = inputs
    oh, ow = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    scale = float(attrs.get("spatial_scale", 1.0))
    ratio = int(attrs.get("sampling_ratio", 0))
    half = attrs.get("coordinate_transformation_mode", "half_pixel" if attrs.get("_opset", 16) >= 16
                     else "output_half_pixel") == "half_pixel"
    mode = attrs.get("mode", "avg")
    work = np.float64 if x.dtype == np.float64 else np.float32
    y = np.zeros((rois.shape[0], x.shape[1], oh, ow), work)
    off = 0.5 if half else 0.0
    for r in range(rois.shape[0]):
        x1, y1, x2, y2 = (float(v) * scale - off for v in rois[r])
        rw, rh = x2 - x1, y2 - y1
        if not half:  # legacy: never smaller than one pixel
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bw, bh = rw / ow, rh / oh
        gh = ratio if ratio > 0 else int(np.ceil(rh / oh))
        gw = ratio if ratio > 0 else int(np.ceil(rw / ow))
        count = max(gh * gw, 1)
        py = y1 + np.arange(oh)[:, None] * bh + (np.arange(gh)[None, :] + 0.5) * bh / max(gh, 1)  # (oh, gh)
        px = x1 + np.arange(ow)[:, None] * bw + (np.arange(gw)[None, :] + 0.5) * bw / max(gw, 1)  # (ow, gw)
        yy = np.broadcast_to(py[:, None, :, None], (oh, ow, gh, gw))
        xx = np.broadcast_to(px[None, :, None, :], (oh, ow, gh, gw))
        taps = _roi_bilinear(x[int(batch[r])].astype(work), yy, xx)  # values (C, oh, ow, gh, gw)
        if mode == "avg":
            y[r] = sum(v * w for v, w in taps).sum(axis=(-2, -1)) / count
        else:  # onnxruntime's max mode: the largest weighted tap of each sample, then the largest sample
            best = np.max(np.stack([v * w for v, w in taps]), axis=0)
            y[r] = best.max(axis=(-2, -1), initial=0.0) if gh * gw else 0.0
    return [y.astype(x.dtype)]


def _roi_align_rule(ctx: InferCtx) -> list[TensorType]:
    x, rois, batch = ctx.inputs
    if ctx.attr("mode", "avg") not in ("avg", "max"):
        ctx.error(f"mode must be 'avg' or 'max', got {ctx.attr('mode')!r}")
    if x.rank != 4 or rois.rank != 2 or batch.rank != 1:
        ctx.error(f"X must be 4-D, rois 2-D (R, 4), batch_indices 1-D, got {x.shape}, {rois.shape}, {batch.shape}")
    ctx.unify(rois.shape[1], 4)
    r = ctx.unify(rois.shape[0], batch.shape[0])
    return [TensorType(x.dtype, (r, x.shape[1], int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))))]


register("RoiAlign", reference=_roi_align_ref, infer=_roi_align_rule)


def _max_roi_pool_ref(inputs: list, attrs: dict) -> list:
    """Caffe's RoIPool: rounded box corners, max over each bin's integer extent (an empty bin gives 0)."""
    x, rois = inputs
    ph, pw = attrs["pooled_shape"]
    scale = float(attrs.get("spatial_scale", 1.0))
    h, w = x.shape[2:]
    y = np.zeros((rois.shape[0], x.shape[1], ph, pw), x.dtype)
    for r, (b, x1, y1, x2, y2) in enumerate(rois.astype(np.float64)):
        sx, sy, ex, ey = (int(np.round(v * scale)) for v in (x1, y1, x2, y2))
        rw, rh = max(ex - sx + 1, 1), max(ey - sy + 1, 1)
        for i in range(ph):
            hs = min(max(int(np.floor(i * rh / ph)) + sy, 0), h)
            he = min(max(int(np.ceil((i + 1) * rh / ph)) + sy, 0), h)
            for j in range(pw):
                ws = min(max(int(np.floor(j * rw / pw)) + sx, 0), w)
                we = min(max(int(np.ceil((j + 1) * rw / pw)) + sx, 0), w)
                if he > hs and we > ws:
                    y[r, :, i, j] = x[int(b), :, hs:he, ws:we].max(axis=(1, 2))
    return [y]


def _max_roi_pool_rule(ctx: InferCtx) -> list[TensorType]:
    x, rois = ctx.inputs
    if x.rank != 4 or rois.rank != 2:
        ctx.error(f"X must be 4-D and rois (R, 5), got {x.shape} and {rois.shape}")
    ctx.unify(rois.shape[1], 5)
    ph, pw = ctx.attr("pooled_shape")
    return [TensorType(x.dtype, (rois.shape[0], x.shape[1], int(ph), int(pw)))]


register("MaxRoiPool", reference=_max_roi_pool_ref, infer=_max_roi_pool_rule)


# ---------------------------------------------------------------------------------------------------------
# NonMaxSuppression
# ---------------------------------------------------------------------------------------------------------
def _corners(b: np.ndarray, center: bool) -> np.ndarray:
    """(..., 4) boxes as (y_min, x_min, y_max, x_max), whatever corner order or format they came in."""
    if center:  # (x_center, y_center, width, height)
        xc, yc, bw, bh = np.moveaxis(b, -1, 0)
        return np.stack([yc - bh / 2, xc - bw / 2, yc + bh / 2, xc + bw / 2], axis=-1)
    y1, x1, y2, x2 = np.moveaxis(b, -1, 0)
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], axis=-1)


def _iou(a: np.ndarray, bs: np.ndarray) -> np.ndarray:
    ih = np.clip(np.minimum(a[2], bs[:, 2]) - np.maximum(a[0], bs[:, 0]), 0, None)
    iw = np.clip(np.minimum(a[3], bs[:, 3]) - np.maximum(a[1], bs[:, 1]), 0, None)
    inter = ih * iw
    union = (a[2] - a[0]) * (a[3] - a[1]) + (bs[:, 2] - bs[:, 0]) * (bs[:, 3] - bs[:, 1]) - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((inter > 0) & (union > 0), inter / union, 0.0)


def _scalar(x: Any, default: Any) -> Any:
    return default if x is None or np.size(x) == 0 else np.asarray(x).reshape(-1)[0]


def _nms_ref(inputs: list, attrs: dict) -> list:
    boxes, scores = inputs[:2]
    rest = list(inputs[2:]) + [None] * 3
    limit = int(_scalar(rest[0], 0))
    iou_t = float(_scalar(rest[1], 0.0))
    score_t = rest[2]
    out: list[tuple[int, int, int]] = []
    corners = _corners(boxes.astype(np.float64), bool(attrs.get("center_point_box", 0)))
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c].astype(np.float64)
            cand = np.arange(s.shape[0]) if score_t is None else np.flatnonzero(s > float(_scalar(score_t, 0)))
            order = cand[np.argsort(-s[cand], kind="stable")]  # best first; ties keep the lower box index
            kept: list[int] = []
            for i in order:
                if len(kept) >= limit:
                    break
                if not kept or not (_iou(corners[b, i], corners[b, kept]) > iou_t).any():
                    kept.append(int(i))
            out += [(b, c, i) for i in kept]
    return [np.array(out, I64).reshape(-1, 3)]


def _nms_rule(ctx: InferCtx) -> list[TensorType]:
    boxes, scores = ctx.inputs[:2]
    if boxes.rank != 3 or scores.rank != 3:
        ctx.error(f"boxes must be (B, N, 4) and scores (B, classes, N), got {boxes.shape} and {scores.shape}")
    ctx.unify(boxes.shape[2], 4)
    ctx.unify(boxes.shape[0], scores.shape[0])
    ctx.unify(boxes.shape[1], scores.shape[2])
    return [TensorType(I64, (ctx.fresh("nms_selected"), 3))]


register("NonMaxSuppression", reference=_nms_ref, infer=_nms_rule)


# ---------------------------------------------------------------------------------------------------------
# CenterCropPad
# ---------------------------------------------------------------------------------------------------------
def _crop_pad_axes(attrs_axes: Any, n: int, rank: int) -> list[int]:
    axes = list(range(rank)) if attrs_axes is None else [int(a) % rank for a in attrs_axes]
    if len(axes) != n:
        raise ValueError(f"shape has {n} values for {len(axes)} axes")
    return axes


def _center_crop_pad_ref(inputs: list, attrs: dict) -> list:
    x, shape = inputs
    target = [int(v) for v in shape]
    axes = _crop_pad_axes(attrs.get("axes"), len(target), x.ndim)
    src = [slice(None)] * x.ndim
    dst = [slice(None)] * x.ndim
    out_shape = list(x.shape)
    for a, t in zip(axes, target):
        d = x.shape[a]
        out_shape[a] = t
        if t < d:
            src[a] = slice((d - t) // 2, (d - t) // 2 + t)
        elif t > d:
            dst[a] = slice((t - d) // 2, (t - d) // 2 + d)
    y = np.zeros(out_shape, x.dtype) if x.dtype != object else np.full(out_shape, "", object)
    y[tuple(dst)] = x[tuple(src)]
    return [y]


def _center_crop_pad_rule(ctx: InferCtx) -> list[TensorType]:
    x, shape = ctx.inputs
    if shape.rank != 1:
        ctx.error(f"shape must be 1-D, got {shape.shape}")
    n = ctx.static(shape.shape[0], "the length of shape")
    try:
        axes = _crop_pad_axes(ctx.attr("axes"), n, x.rank)
    except ValueError as e:
        ctx.error(str(e))
    vals = arg_value(ctx, 1)
    out = list(x.shape)
    for k, a in enumerate(axes):
        v = vals[k] if vals is not None else ctx.fresh("center_crop_pad")
        if is_static(v) and v < 0:
            ctx.error(f"target size {v} for axis {a} is negative")
        out[a] = norm(v)
    return [TensorType(x.dtype, tuple(out))]


register("CenterCropPad", reference=_center_crop_pad_ref, infer=_center_crop_pad_rule)
