"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (the latter is NLL over a log-softmax, as its
function body says, so both share one reduction and one ignore_index rule).

"mean" divides by the summed weights of the targets that count (not by the element count): an ignored target
contributes neither loss nor weight, so a batch whose targets are all ignored gives 0/0 = NaN, as in ONNX.
Targets equal to ignore_index may lie outside [0, C); other out-of-range targets are an error naming the value.
"""

from __future__ import annotations

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType
from dynshape.ops import dtypes as dt

_REDUCTIONS = ("none", "sum", "mean")


def _nll(logp: np.ndarray, target: np.ndarray, weight: np.ndarray | None, attrs: dict) -> np.ndarray:
    """Loss of (N, C, d...) log-probabilities against (N, d...) targets, computed in `logp`'s dtype."""
    c = logp.shape[1]
    ignore = attrs.get("ignore_index")
    t = target.astype(np.int64)
    keep = np.ones(t.shape, bool) if ignore is None else t != ignore
    bad = keep & ((t < 0) | (t >= c))
    if bad.any():
        raise ValueError(f"target value {t[bad][0]} is outside [0, {c})"
                         + ("" if ignore is None else f" and is not ignore_index ({ignore})"))
    safe = np.where(keep, t, 0)
    picked = np.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    w = np.ones(c, logp.dtype) if weight is None else weight.astype(logp.dtype)
    wt = np.where(keep, w[safe], 0).astype(logp.dtype)
    loss = -picked * wt
    red = attrs.get("reduction", "mean")
    if red == "none":
        return loss
    if red == "sum":
        return np.asarray(loss.sum(), logp.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(loss.sum() / wt.sum(), logp.dtype)


def _nll_ref(inputs: list, attrs: dict) -> list:
    x, target = inputs[:2]
    weight = inputs[2] if len(inputs) > 2 else None
    cd = dt.compute_dtype(x.dtype)
    return [_nll(x.astype(cd), target, weight, attrs).astype(x.dtype)]


def _sce_ref(inputs: list, attrs: dict) -> list:
    x, target = inputs[:2]
    weight = inputs[2] if len(inputs) > 2 else None
    xc = x.astype(dt.compute_dtype(x.dtype))
    s = xc - np.max(xc, axis=1, keepdims=True, initial=-np.inf) if xc.shape[1] else xc
    logp = s - np.log(np.sum(np.exp(s), axis=1, keepdims=True))
    return [_nll(logp, target, weight, attrs).astype(x.dtype), logp.astype(x.dtype)]


def _loss_rule(ctx: InferCtx) -> list[TensorType]:
    x, target = ctx.inputs[:2]
    weight = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    red = ctx.attr("reduction", "mean")
    if red not in _REDUCTIONS:
        ctx.error(f"reduction must be one of {', '.join(_REDUCTIONS)}, got {red!r}")
    if x.rank < 2:
        ctx.error(f"the scores must be at least 2-D (N, C, d...), got {x.shape}")
    if target.rank != x.rank - 1:
        ctx.error(f"the target must be (N, d...) for scores (N, C, d...): rank {x.rank - 1}, got {target.shape}")
    if target.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        ctx.error(f"the target must be int32 or int64, got {target.dtype}")
    shape = (ctx.unify(x.shape[0], target.shape[0]),
             *(ctx.unify(a, b) for a, b in zip(x.shape[2:], target.shape[1:])))
    if weight is not None:
        if weight.rank != 1:
            ctx.error(f"the weight must be 1-D (C,), got {weight.shape}")
        ctx.unify(weight.shape[0], x.shape[1])
    out = TensorType(x.dtype, shape if red == "none" else ())
    return [out, TensorType(x.dtype, x.shape)] if ctx.op_type == "SoftmaxCrossEntropyLoss" else [out]


register("NegativeLogLikelihoodLoss", reference=_nll_ref, infer=_loss_rule)
register("SoftmaxCrossEntropyLoss", reference=_sce_ref, infer=_loss_rule)
