"""Neural-network ops: softmax family, normalizations, MatMul/Gemm/Einsum. numpy references + shape rules.

Narrow floats (float16, bfloat16, ...) are computed in float32 and rounded once; normalizations compute their
statistics in the `stash_type` precision (float32 by default), as the ONNX function bodies do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import Layout, register
from dynshape.ir.types import TensorType
from dynshape.ops import dtypes as dt


def _f(x: np.ndarray) -> np.ndarray:
    """`x` in a dtype numpy computes well in (float32 for narrow floats)."""
    return x.astype(dt.compute_dtype(x.dtype), copy=False)


def _stash(x: np.ndarray, attrs: dict) -> np.ndarray:
    """`x` in the stash_type precision (never below float32, never below X's own precision)."""
    stash = dt.np_dtype(attrs.get("stash_type", 1))
    return x.astype(np.promote_types(dt.compute_dtype(stash), dt.compute_dtype(x.dtype)), copy=False)


def _same_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    return [TensorType(x.dtype, x.shape)]


def _axis(ctx: InferCtx, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        ctx.error(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


# ---------------------------------------------------------------------------------------------------------
# Softmax / LogSoftmax / Hardmax
# ---------------------------------------------------------------------------------------------------------
def _softmax_family(fn: Callable[[np.ndarray, int], np.ndarray]) -> Callable[[list, dict], list]:
    """Opset >= 13 normalizes along `axis` (default -1); before 13 the input is flattened to 2-D at `axis`
    (default 1) and the whole trailing block is normalized together."""

    def ref(inputs: list, attrs: dict) -> list:
        x = inputs[0]
        if x.size == 0:  # an empty tensor (or an empty axis): nothing to normalize
            return [x.copy()]
        if attrs.get("_opset", 99) >= 13:
            y = fn(_f(x), attrs.get("axis", -1) % max(x.ndim, 1))
        else:
            axis = attrs.get("axis", 1) % max(x.ndim, 1)
            rows = int(np.prod(x.shape[:axis]))
            y = fn(_f(x).reshape(rows, -1), 1).reshape(x.shape)
        return [np.asarray(y).astype(x.dtype)]

    return ref


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    s = x - np.max(x, axis=axis, keepdims=True)
    return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


def _hardmax(x: np.ndarray, axis: int) -> np.ndarray:
    """1 at the first maximum along `axis`, 0 elsewhere."""
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    y = np.zeros_like(x)
    np.put_along_axis(y, idx, 1, axis=axis)
    return y


def _softmax_rule(ctx: InferCtx) -> list[TensorType]:
    """Same type as the input; the axis must name one of its axes (the reference would wrap it modulo the rank,
    a silent wrong result where onnxruntime refuses the model)."""
    x = ctx.inputs[0]
    _axis(ctx, int(ctx.attr("axis", -1 if ctx.opset >= 13 else 1)), x.rank)
    return _same_rule(ctx)


register("Softmax", reference=_softmax_family(_softmax), infer=_softmax_rule, layout=Layout.AXIS)
register("LogSoftmax", reference=_softmax_family(_log_softmax), infer=_softmax_rule, layout=Layout.AXIS)
register("Hardmax", reference=_softmax_family(_hardmax), infer=_softmax_rule)


# ---------------------------------------------------------------------------------------------------------
# normalizations
# ---------------------------------------------------------------------------------------------------------
def _per_channel(p: np.ndarray, rank: int) -> np.ndarray:
    """A (C,) parameter shaped to broadcast against (N, C, d1, ...)."""
    return p.reshape((-1,) + (1,) * (rank - 2))


def _batch_norm(inputs: list, attrs: dict) -> list:
    """Inference uses the running statistics; training_mode=1 (opset >= 14) normalizes with the batch's own
    (population) statistics and also returns the updated running mean and variance."""
    x, scale, bias, mean, var = inputs[:5]
    eps, rank = attrs.get("epsilon", 1e-5), x.ndim
    xc = _f(x)
    training = bool(attrs.get("training_mode", 0))
    if training:
        axes = (0, *range(2, rank))
        bmean, bvar = xc.mean(axis=axes), xc.var(axis=axes)
        m = attrs.get("momentum", 0.9)
        run_mean = _f(mean) * m + bmean * (1 - m)
        run_var = _f(var) * m + bvar * (1 - m)
        mean, var = bmean, bvar
    y = (_per_channel(_f(scale), rank) * (xc - _per_channel(_f(mean), rank))
         / np.sqrt(_per_channel(_f(var), rank) + eps) + _per_channel(_f(bias), rank))
    out = [y.astype(x.dtype)]
    if training:
        out += [run_mean.astype(inputs[3].dtype), run_var.astype(inputs[4].dtype)]
    return out


def _batch_norm_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    if len(x.shape) < 2:
        ctx.error("X must have rank >= 2 (N, C, ...)")
    c = x.shape[1]
    for p in ctx.inputs[1:5]:
        if p is not None:
            if len(p.shape) != 1:
                ctx.error(f"scale/bias/mean/var must be 1-D (C,), got shape {p.shape}")
            c = ctx.unify(c, p.shape[0])
    stat = TensorType(ctx.inputs[3].dtype if len(ctx.inputs) > 3 else x.dtype, (c,))
    extra = 2 if ctx.opset >= 14 else 4  # running mean/var (+ saved mean/var before opset 14)
    return [TensorType(x.dtype, x.shape)] + [stat] * extra


def _instance_norm(inputs: list, attrs: dict) -> list:
    x, scale, bias = inputs
    xc, rank = _f(x), x.ndim
    axes = tuple(range(2, rank))
    mean = xc.mean(axis=axes, keepdims=True)
    var = xc.var(axis=axes, keepdims=True)
    y = (_per_channel(_f(scale), rank) * (xc - mean) / np.sqrt(var + attrs.get("epsilon", 1e-5))
         + _per_channel(_f(bias), rank))
    return [y.astype(x.dtype)]


def _channel_params_rule(ctx: InferCtx) -> list[TensorType]:
    """InstanceNormalization / GroupNormalization (opset >= 21): scale and bias are (C,)."""
    x = ctx.inputs[0]
    if len(x.shape) < 2:
        ctx.error("X must have rank >= 2 (N, C, ...)")
    for p in ctx.inputs[1:3]:
        if p is not None and len(p.shape) == 1 and not (ctx.op_type == "GroupNormalization" and ctx.opset < 21):
            ctx.unify(x.shape[1], p.shape[0])
    return [TensorType(x.dtype, x.shape)]


def _layer_norm(inputs: list, attrs: dict) -> list:
    """Normalize over axes [axis, rank); Mean and InvStdDev keep the reduced axes as 1s, in stash precision."""
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = attrs.get("axis", -1) % x.ndim
    xs = _stash(x, attrs)
    axes = tuple(range(axis, x.ndim))
    mean = xs.mean(axis=axes, keepdims=True)
    inv_std = 1 / np.sqrt(((xs - mean) ** 2).mean(axis=axes, keepdims=True) + attrs.get("epsilon", 1e-5))
    y = (xs - mean) * inv_std * _stash(scale, attrs)
    if bias is not None:
        y = y + _stash(bias, attrs)
    stash = dt.np_dtype(attrs.get("stash_type", 1))
    return [y.astype(x.dtype), mean.astype(stash), inv_std.astype(stash)]


def _layer_norm_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    rank = len(x.shape)
    axis = _axis(ctx, ctx.attr("axis", -1), rank)
    ctx.broadcast(tuple(x.shape[axis:]), *[tuple(p.shape) for p in ctx.inputs[1:3] if p is not None])
    stat_shape = tuple(x.shape[:axis]) + (1,) * (rank - axis)
    stash = dt.np_dtype(ctx.attr("stash_type", 1))
    return [TensorType(x.dtype, x.shape), TensorType(stash, stat_shape), TensorType(stash, stat_shape)]


def _group_norm(inputs: list, attrs: dict) -> list:
    """Statistics per (sample, group of C/G channels). Opset >= 21 scale/bias are per channel; opset 18's
    were per group."""
    x, scale, bias = inputs
    g = attrs["num_groups"]
    n, c = x.shape[:2]
    xs = _stash(x, attrs).reshape(n, g, -1)
    mean = xs.mean(axis=2, keepdims=True)
    var = xs.var(axis=2, keepdims=True)
    y = ((xs - mean) / np.sqrt(var + attrs.get("epsilon", 1e-5))).reshape(x.shape)
    scale, bias = _stash(scale, attrs), _stash(bias, attrs)
    if attrs.get("_opset", 99) < 21:  # opset 18: one scale/bias per group
        scale, bias = np.repeat(scale, c // g), np.repeat(bias, c // g)
    y = y * _per_channel(scale, x.ndim) + _per_channel(bias, x.ndim)
    return [y.astype(x.dtype)]


def _mvn(inputs: list, attrs: dict) -> list:
    """(X - E[X]) / (sqrt(Var[X]) + 1e-9) over `axes` (default N, H, W), as the ONNX function body."""
    x = inputs[0]
    axes = tuple(attrs.get("axes", [0, 2, 3]))
    xc = _f(x)
    mean = xc.mean(axis=axes, keepdims=True)
    std = np.sqrt(((xc - mean) ** 2).mean(axis=axes, keepdims=True))
    return [((xc - mean) / (std + 1e-9)).astype(x.dtype)]


def _rms_norm(inputs: list, attrs: dict) -> list:
    x, scale = inputs
    axis = attrs.get("axis", -1) % x.ndim
    xs = _stash(x, attrs)
    ms = (xs * xs).mean(axis=tuple(range(axis, x.ndim)), keepdims=True)
    y = xs / np.sqrt(ms + attrs.get("epsilon", 1e-5)) * _stash(scale, attrs)
    return [y.astype(x.dtype)]


def _rms_norm_rule(ctx: InferCtx) -> list[TensorType]:
    x, scale = ctx.inputs[:2]
    axis = _axis(ctx, ctx.attr("axis", -1), len(x.shape))
    ctx.broadcast(tuple(x.shape[axis:]), tuple(scale.shape))
    return [TensorType(x.dtype, x.shape)]


def _lp_norm(inputs: list, attrs: dict) -> list:
    """x / ||x||_p along `axis`; a zero norm gives 0 rather than NaN."""
    x = inputs[0]
    p = attrs.get("p", 2)
    xc = _f(x)
    norm = np.sum(np.abs(xc) ** p, axis=attrs.get("axis", -1), keepdims=True) ** (1.0 / p)
    with np.errstate(all="ignore"):
        y = np.where(norm == 0, 0, xc / norm)
    return [y.astype(x.dtype)]


def _lrn(inputs: list, attrs: dict) -> list:
    """Local response normalization across channels: x / (bias + alpha/size * sum of squares)^beta, the sum
    over channels [c - floor((size-1)/2), c + ceil((size-1)/2)] clipped to the valid range."""
    x, size = inputs[0], attrs["size"]
    xc = _f(x)
    sq = xc * xc
    lo, hi = (size - 1) // 2, size // 2
    c = x.shape[1]
    win = np.stack([sq[:, max(0, k - lo):min(c, k + hi + 1)].sum(axis=1) for k in range(c)], axis=1)
    y = xc / (attrs.get("bias", 1.0) + attrs.get("alpha", 1e-4) / size * win) ** attrs.get("beta", 0.75)
    return [y.astype(x.dtype)]


register("LRN", reference=_lrn, infer=_same_rule, layout=Layout.SPATIAL)  # across channels: the last axis, wrapped
register("BatchNormalization", reference=_batch_norm, infer=_batch_norm_rule)
# per channel over the map: channels last it vectorises over the channels
register("InstanceNormalization", reference=_instance_norm, infer=_channel_params_rule, layout=Layout.SPATIAL)
register("LayerNormalization", reference=_layer_norm, infer=_layer_norm_rule)
register("GroupNormalization", reference=_group_norm, infer=_channel_params_rule)
register("MeanVarianceNormalization", reference=_mvn, infer=_same_rule)
register("RMSNormalization", reference=_rms_norm, infer=_rms_norm_rule)
register("LpNormalization", reference=_lp_norm, infer=_same_rule)


# ---------------------------------------------------------------------------------------------------------
# MatMul / Gemm / Einsum / MatMulInteger
# ---------------------------------------------------------------------------------------------------------
def _matmul(inputs: list, attrs: dict) -> list:
    a, b = inputs
    return [np.matmul(_f(a), _f(b)).astype(a.dtype)]


def matmul_shape(ctx: InferCtx, a: tuple, b: tuple) -> tuple:
    """numpy matmul shape: 1-D operands get a temporary unit dim; inner dims unify; batch dims broadcast."""
    if not a or not b:
        ctx.error("MatMul operands must have rank >= 1")
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    ctx.unify(a2[-1], b2[-2])
    batch = tuple(ctx.broadcast(a2[:-2], b2[:-2]))
    return batch + (() if len(a) == 1 else (a2[-2],)) + (() if len(b) == 1 else (b2[-1],))


def _matmul_rule(ctx: InferCtx) -> list[TensorType]:
    a, b = ctx.inputs
    if a.dtype != b.dtype:
        ctx.error(f"A and B must share one dtype, got {a.dtype} and {b.dtype}", fix="insert a Cast")
    return [TensorType(a.dtype, matmul_shape(ctx, tuple(a.shape), tuple(b.shape)))]


def _gemm(inputs: list, attrs: dict) -> list:
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    ac = _f(a).T if attrs.get("transA", 0) else _f(a)
    bc = _f(b).T if attrs.get("transB", 0) else _f(b)
    y = attrs.get("alpha", 1.0) * (ac @ bc)
    if c is not None:
        y = y + attrs.get("beta", 1.0) * _f(c)
    return [np.asarray(y).astype(a.dtype)]


def _gemm_rule(ctx: InferCtx) -> list[TensorType]:
    """Y (M, N) = alpha * A' (M, K) @ B' (K, N) + beta * C, C broadcast unidirectionally to (M, N)."""
    a, b = ctx.inputs[0], ctx.inputs[1]
    if len(a.shape) != 2 or len(b.shape) != 2:
        ctx.error(f"Gemm needs 2-D A and B, got shapes {a.shape} and {b.shape}")
    m, k = a.shape[::-1] if ctx.attr("transA", 0) else a.shape
    k2, n = b.shape[::-1] if ctx.attr("transB", 0) else b.shape
    ctx.unify(k, k2)
    c = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    if c is not None:
        if len(c.shape) > 2:
            ctx.error(f"C must broadcast to (M, N), got shape {c.shape}")
        ctx.broadcast((m, n), tuple(c.shape))
    return [TensorType(a.dtype, (m, n))]


def _einsum(inputs: list, attrs: dict) -> list:
    eq = attrs["equation"].replace(" ", "")
    return [np.asarray(np.einsum(eq, *[_f(x) for x in inputs])).astype(inputs[0].dtype)]


def _einsum_rule(ctx: InferCtx) -> list[TensorType]:
    """Each label names one dim (repeats unify); `...` dims broadcast across operands; the implicit output is
    `...` followed by the labels used exactly once, in alphabetical order."""
    eq = str(ctx.attr("equation", "")).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ctx.inputs):
        ctx.error(f"equation {eq!r} has {len(terms)} operands but the node has {len(ctx.inputs)} inputs")
    dims: dict[str, Any] = {}
    ellipses = []
    for term, t in zip(terms, ctx.inputs):
        shape = tuple(t.shape)
        pre, dots, post = term.partition("...")
        n_ell = len(shape) - len(pre) - len(post)
        if n_ell < 0 or (not dots and n_ell):
            ctx.error(f"term {term!r} does not match operand rank {len(shape)}")
        if dots:
            ellipses.append(shape[len(pre):len(pre) + n_ell])
        for label, d in zip(pre + post, shape[:len(pre)] + shape[len(pre) + n_ell:]):
            dims[label] = ctx.unify(dims[label], d) if label in dims else d
    ell = tuple(ctx.broadcast(*ellipses)) if ellipses else ()
    if not arrow:
        letters = lhs.replace("...", "").replace(",", "")
        rhs = ("..." if ellipses else "") + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    pre, dots, post = rhs.partition("...")
    for label in pre + post:
        if label not in dims:
            ctx.error(f"output label {label!r} does not appear in the inputs of {eq!r}")
    shape = tuple(dims[c] for c in pre) + (ell if dots else ()) + tuple(dims[c] for c in post)
    return [TensorType(ctx.inputs[0].dtype, shape)]


def _matmul_integer(inputs: list, attrs: dict) -> list:
    """(A - a_zero_point) @ (B - b_zero_point) in int32; a 1-D a_zero_point is per row of A."""
    a, b = inputs[0].astype(np.int32), inputs[1].astype(np.int32)
    azp = inputs[2] if len(inputs) > 2 else None
    bzp = inputs[3] if len(inputs) > 3 else None
    if azp is not None:
        a = a - (azp.astype(np.int32).reshape(-1, 1) if azp.ndim == 1 and azp.size > 1 else azp.astype(np.int32))
    if bzp is not None:
        b = b - bzp.astype(np.int32)
    return [np.matmul(a, b).astype(np.int32)]


def _matmul_integer_rule(ctx: InferCtx) -> list[TensorType]:
    a, b = ctx.inputs[0], ctx.inputs[1]
    return [TensorType(np.dtype(np.int32), matmul_shape(ctx, tuple(a.shape), tuple(b.shape)))]


def _det(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    return [np.asarray(np.linalg.det(_f(x))).astype(x.dtype)]


def _det_rule(ctx: InferCtx) -> list[TensorType]:
    """Det of [..., M, M] is [...]; the two trailing dims must agree."""
    x = ctx.inputs[0]
    if len(x.shape) < 2:
        ctx.error("Det needs a tensor of square matrices [..., M, M]")
    ctx.unify(x.shape[-2], x.shape[-1])
    return [TensorType(x.dtype, tuple(x.shape[:-2]))]


register("Det", reference=_det, infer=_det_rule)
register("MatMul", reference=_matmul, infer=_matmul_rule)
register("Gemm", reference=_gemm, infer=_gemm_rule)
register("Einsum", reference=_einsum, infer=_einsum_rule)
register("MatMulInteger", reference=_matmul_integer, infer=_matmul_integer_rule)
