"""Sliding-window ops beyond Conv and pooling: DeformConv, Col2Im, MaxUnpool.

They share Conv's geometry (`ops.conv.window_out`): the output size formula is written once over `int | Expr`,
so a symbolic spatial dim gives an exact symbolic output. DeformConv samples its shifted kernel taps with the
same interpolation as GridSample (`ops.vision.sample`, bilinear, zeros outside the input).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType
from dynshape.ops import dtypes as dt
from dynshape.ops.conv import window_out, window_params
from dynshape.ops.dims import arg_value, is_static, norm, prod, require_divides
from dynshape.ops.vision import sample


# ---------------------------------------------------------------------------------------------------------
# DeformConv
# ---------------------------------------------------------------------------------------------------------
def _deform_conv_ref(inputs: list, attrs: dict) -> list:
    x, w, offset = inputs[:3]
    bias, mask = (list(inputs[3:]) + [None, None])[:2]
    nd = x.ndim - 2
    kernel = list(attrs.get("kernel_shape") or w.shape[2:])
    strides, dilations, pbs, _, _ = window_params(attrs.get, nd)
    g, og = int(attrs.get("group", 1)), int(attrs.get("offset_group", 1))
    n, c = x.shape[:2]
    m = w.shape[0]
    outs = list(offset.shape[2:])
    k = int(np.prod(kernel))
    work = np.float64 if x.dtype == np.float64 else np.float32
    off = offset.astype(work).reshape(n, og, k, nd, *outs)
    msk = np.ones((n, og, k, *outs), work) if mask is None else mask.astype(work).reshape(n, og, k, *outs)
    grids = np.meshgrid(*[np.arange(o) for o in outs], indexing="ij")
    cg = c // og
    cols = np.zeros((n, c, k, *outs), work)  # every channel's sampled value at every kernel tap
    for t, tap in enumerate(itertools.product(*[range(kk) for kk in kernel])):
        for gi in range(og):
            coords = [grids[a][None] * strides[a] - pbs[a] + tap[a] * dilations[a] + off[:, gi, t, a]
                      for a in range(nd)]
            xs = x[:, gi * cg:(gi + 1) * cg].astype(work)
            cols[:, gi * cg:(gi + 1) * cg, t] = sample(xs, coords, "linear", "zeros", True) * msk[:, gi, t][:, None]
    cin = c // g
    colsg = cols.reshape(n, g, cin * k, -1)  # (n, g, cin*k, P)
    wg = w.astype(work).reshape(g, m // g, cin * k)
    y = np.einsum("gmk,ngkp->ngmp", wg, colsg).reshape(n, m, *outs)
    if bias is not None:
        y = y + bias.astype(work).reshape(1, m, *[1] * nd)
    return [y.astype(x.dtype)]


def _deform_conv_rule(ctx: InferCtx) -> list[TensorType]:
    x, w, offset = ctx.inputs[:3]
    bias, mask = (list(ctx.inputs[3:]) + [None, None])[:2]
    if x.rank < 3 or w.rank != x.rank or offset.rank != x.rank:
        ctx.error(f"X, W and offset must share one rank >= 3, got {x.shape}, {w.shape}, {offset.shape}")
    nd = x.rank - 2
    g, og = int(ctx.attr("group", 1)), int(ctx.attr("offset_group", 1))
    ctx.unify(x.shape[1], w.shape[1] * g)
    require_divides(ctx, g, w.shape[0], "output channels over group")
    require_divides(ctx, og, x.shape[1], "input channels over offset_group")
    kernel = [norm(k) for k in (ctx.attr("kernel_shape") or w.shape[2:])]
    strides, dilations, pbs, pes, _ = window_params(ctx.attr, nd)
    outs = [window_out(h, k, int(s), int(d), pb, pe, "NOTSET", False)[0]
            for h, k, s, d, pb, pe in zip(x.shape[2:], kernel, strides, dilations, pbs, pes)]
    n = ctx.unify(x.shape[0], offset.shape[0])
    ctx.unify(offset.shape[1], og * prod(kernel) * nd)
    for o, d in zip(outs, offset.shape[2:]):
        ctx.unify(o, d)
    if mask is not None:
        ctx.unify(mask.shape[0], n)
        ctx.unify(mask.shape[1], og * prod(kernel))
        for o, d in zip(outs, mask.shape[2:]):
            ctx.unify(o, d)
    if bias is not None:
        ctx.unify(bias.shape[0], w.shape[0])
    return [TensorType(x.dtype, (n, w.shape[0], *outs))]


register("DeformConv", reference=_deform_conv_ref, infer=_deform_conv_rule)


# ---------------------------------------------------------------------------------------------------------
# Col2Im: the inverse of im2col, overlapping blocks summed
# ---------------------------------------------------------------------------------------------------------
def _col2im_ref(inputs: list, attrs: dict) -> list:
    x, image, block = inputs
    image, block = [int(v) for v in image], [int(v) for v in block]
    nd = len(image)
    strides, dilations, pbs, pes, _ = window_params(attrs.get, nd)
    n, ck, _ = x.shape
    k = int(np.prod(block))
    c = ck // k
    outs = [window_out(h, b, s, d, pb, pe, "NOTSET", False)[0]
            for h, b, s, d, pb, pe in zip(image, block, strides, dilations, pbs, pes)]
    padded = [h + pb + pe for h, pb, pe in zip(image, pbs, pes)]
    acc = np.zeros((n, c, *padded), np.float64 if dt.is_float(x.dtype) or x.dtype.kind in "iub" else x.dtype)
    cols = x.reshape(n, c, *block, *outs)
    for tap in itertools.product(*[range(b) for b in block]):
        dst = tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(tap, dilations, outs, strides))
        acc[(slice(None), slice(None), *dst)] += cols[(slice(None), slice(None), *tap)]
    crop = tuple(slice(pb, pb + h) for pb, h in zip(pbs, image))
    return [acc[(slice(None), slice(None), *crop)].astype(x.dtype)]


def _col2im_rule(ctx: InferCtx) -> list[TensorType]:
    x, image, block = ctx.inputs
    if x.rank != 3 or image.rank != 1 or block.rank != 1:
        ctx.error(f"input must be (N, C*prod(block), L) and image_shape, block_shape 1-D, got {x.shape}, "
                  f"{image.shape}, {block.shape}")
    nd = ctx.static(image.shape[0], "the length of image_shape")
    ctx.unify(block.shape[0], nd)
    imgs, blocks = arg_value(ctx, 1), arg_value(ctx, 2)
    if blocks is None:
        c = ctx.fresh("col2im_channels")
    else:
        c = x.shape[1] // prod(blocks)
        require_divides(ctx, prod(blocks), x.shape[1], "the channel dim over prod(block_shape)")
    if imgs is None:
        spatial = [ctx.fresh("col2im") for _ in range(nd)]
    else:
        spatial = [norm(v) for v in imgs]
        if blocks is not None:
            strides, dilations, pbs, pes, _ = window_params(ctx.attr, nd)
            outs = [window_out(h, b, int(s), int(d), pb, pe, "NOTSET", False)[0]
                    for h, b, s, d, pb, pe in zip(spatial, blocks, strides, dilations, pbs, pes)]
            ctx.unify(x.shape[2], prod(outs))
    return [TensorType(x.dtype, (x.shape[0], c, *spatial))]


register("Col2Im", reference=_col2im_ref, infer=_col2im_rule)


# ---------------------------------------------------------------------------------------------------------
# MaxUnpool
# ---------------------------------------------------------------------------------------------------------
def _unpool_shape(spatial: Any, kernel: list, strides: list, pbs: list, pes: list) -> list:
    return [(h - 1) * s - pb - pe + k for h, k, s, pb, pe in zip(spatial, kernel, strides, pbs, pes)]


def _max_unpool_ref(inputs: list, attrs: dict) -> list:
    x, idx = inputs[:2]
    shape = inputs[2] if len(inputs) > 2 else None
    nd = x.ndim - 2
    kernel = list(attrs["kernel_shape"])
    strides, _, pbs, pes, _ = window_params(attrs.get, nd)
    natural = [*x.shape[:2], *_unpool_shape(x.shape[2:], kernel, strides, pbs, pes)]
    y = np.zeros(int(np.prod(natural)), x.dtype)
    flat = idx.astype(np.int64).reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= y.size):
        raise ValueError(f"an index is outside the unpooled tensor's {y.size} elements")
    y[flat] = x.reshape(-1)
    y = y.reshape(natural)
    if shape is None:
        return [y]
    # output_shape: indices still address the natural (kernel/stride) layout, which is placed at the start
    # of the requested shape, as onnxruntime and the ONNX reference do
    out = np.zeros([int(v) for v in shape], x.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(out.shape, natural))
    out[common] = y[common]
    return [out]


def _max_unpool_rule(ctx: InferCtx) -> list[TensorType]:
    x, idx = ctx.inputs[:2]
    shape = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    for a, b in zip(x.shape, idx.shape):
        ctx.unify(a, b)
    if idx.rank != x.rank:
        ctx.error(f"I must have X's shape, got {idx.shape} for {x.shape}")
    kernel = ctx.attr("kernel_shape")
    if kernel is None:
        ctx.error("kernel_shape is required")
    if shape is not None:
        n = ctx.static(shape.shape[0], "the length of output_shape")
        if n != x.rank:
            ctx.error(f"output_shape has {n} values for a rank-{x.rank} input")
        vals = arg_value(ctx, 2)
        out = [norm(v) for v in vals] if vals is not None else [ctx.fresh("max_unpool") for _ in range(n)]
        return [TensorType(x.dtype, tuple(out))]
    strides, _, pbs, pes, _ = window_params(ctx.attr, x.rank - 2)
    spatial = _unpool_shape(x.shape[2:], [int(k) for k in kernel], strides, pbs, pes)
    for d in spatial:
        if is_static(d) and d < 0:
            ctx.error(f"the unpooled size {d} is negative")
    return [TensorType(x.dtype, (*x.shape[:2], *spatial))]


register("MaxUnpool", reference=_max_unpool_ref, infer=_max_unpool_rule)
