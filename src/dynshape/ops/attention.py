"""Attention ops of recent opsets: Attention (23, 24, 25), FlexAttention (ai.onnx.preview), RotaryEmbedding.

Numerics follow the spec's own recipe, because a different but "better" order gives different low-precision
results: Q and K are each scaled by sqrt(scale) in the input type before the product (the spec's guard against
overflow in float16), products accumulate in float32 (float64 for double) and round once to the input type,
and the elementwise steps (softcap, bias, softmax) run in the input type, or in `softmax_precision` when the
node asks for it. A query row whose keys are all masked yields zeros, never NaN (the opset-23 errata).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType
from dynshape.ops import dtypes as dt
from dynshape.ops.dims import is_static, require_divides
from dynshape.sym import divides


def _acc(dtype: np.dtype) -> np.dtype:
    """Accumulation type of a product: float64 for double, float32 for everything narrower."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _matmul(a: np.ndarray, b: np.ndarray, out: np.dtype) -> np.ndarray:
    acc = _acc(out)
    return np.matmul(a.astype(acc, copy=False), b.astype(acc, copy=False)).astype(out)


def exact_div(ctx: InferCtx, n: Any, k: Any, what: str) -> Any:
    """n / k where the op requires k to divide n (a hidden size split into heads)."""
    if is_static(k) and int(k) <= 0:
        ctx.error(f"{what}: the number of heads must be positive, got {k}")
    require_divides(ctx, k, n, what)
    return n // k


def heads_attr(ctx: InferCtx, name: str) -> int:
    v = ctx.attr(name)
    if v is None:
        ctx.error(f"3-D inputs need the {name!r} attribute (the hidden size is split into that many heads)")
    if int(v) <= 0:
        ctx.error(f"{name} must be positive, got {v}")
    return int(v)


def _softmax_rows(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; an all -inf row gives zeros (no NaN, no warning)."""
    m = np.max(x, axis=-1, keepdims=True, initial=-np.inf)  # initial: an empty row (no keys) is all masked
    m = np.where(np.isneginf(m), np.zeros((), x.dtype), m)
    e = np.exp(x - m)
    s = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(s == 0, np.ones((), x.dtype), s)


# ---------------------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------------------
def _to_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, hd = x.shape
    return x.reshape(b, s, heads, hd // heads).transpose(0, 2, 1, 3)


def _causal_allowed(sq: int, t: int, offset: Any) -> np.ndarray:
    """Bottom-right causal frontier: query i sees key j iff j <= i + offset (offset scalar or per batch)."""
    i = np.arange(sq).reshape(sq, 1)
    j = np.arange(t).reshape(1, t)
    if np.ndim(offset):
        return (j <= i + np.reshape(offset, (-1, 1, 1)))[:, None]  # (B, 1, Sq, T)
    return j <= i + int(offset)


def _window_allowed(sq: int, t: int, offset: Any, left: int, right: int) -> np.ndarray:
    i = np.arange(sq).reshape(sq, 1)
    j = np.arange(t).reshape(1, t)
    diff = (i + np.reshape(offset, (-1, 1, 1)))[:, None] - j if np.ndim(offset) else i + int(offset) - j
    ok = np.ones(np.shape(diff), dtype=bool)
    if left >= 0:
        ok &= diff <= left
    if right >= 0:
        ok &= -diff <= right
    return ok


def _bias(dtype: np.dtype, sq: int, t: int, mask: np.ndarray | None, causal: bool, offset: Any,
          window: tuple[int, int], nonpad: np.ndarray | None) -> np.ndarray:
    """The additive bias (0 or -inf, plus a float mask) broadcastable to (B, Hq, Sq, T)."""
    zero, ninf = dtype.type(0), dtype.type(-np.inf)
    bias = np.zeros((sq, t), dtype)
    if mask is not None:
        pad = t - mask.shape[-1]
        if pad > 0:  # a shorter mask is padded to T with "not attended"
            fill = False if mask.dtype == np.bool_ else -np.inf
            mask = np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)], constant_values=fill)
        bias = bias + (np.where(mask, zero, ninf) if mask.dtype == np.bool_ else mask.astype(dtype))
    if causal:
        bias = bias + np.where(_causal_allowed(sq, t, offset), zero, ninf)
    if window[0] >= 0 or window[1] >= 0:
        bias = bias + np.where(_window_allowed(sq, t, offset, *window), zero, ninf)
    if nonpad is not None:
        keep = np.arange(t) < nonpad.reshape(-1, 1)
        bias = bias + np.where(keep, zero, ninf).reshape(-1, 1, 1, t)
    return bias


def _attention_ref(inputs: list, attrs: dict) -> list:
    q, k, v = inputs[:3]
    mask, past_k, past_v, nonpad = (list(inputs[3:]) + [None] * 4)[:4]
    dtype = q.dtype
    three_d = q.ndim == 3
    if three_d:
        hq, hkv = attrs["q_num_heads"], attrs["kv_num_heads"]
        q, k, v = _to_heads(q, hq), _to_heads(k, hkv), _to_heads(v, hkv)
    scale = attrs.get("scale")
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[3])
    s = dtype.type(np.sqrt(scale))
    if past_k is not None:
        k = np.concatenate([past_k, k], axis=2)
        v = np.concatenate([past_v, v], axis=2)
    present_k, present_v = k, v
    sq, t = q.shape[2], k.shape[2]
    if past_k is not None:
        offset: Any = past_k.shape[2]
    elif nonpad is not None:
        offset = nonpad.reshape(-1).astype(np.int64) - sq
    else:
        offset = 0
    window = (int(attrs.get("left_window_size", -1)), int(attrs.get("right_window_size", -1)))
    bias = _bias(dtype, sq, t, mask, bool(attrs.get("is_causal", 0)), offset, window, nonpad)
    if q.shape[1] != k.shape[1]:  # grouped-query: query head h reads key/value head h // groups (0 heads: 0)
        groups = q.shape[1] // k.shape[1] if k.shape[1] else 0
        k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    qk = _matmul(q * s, np.swapaxes(k * s, -1, -2), dtype)
    mode = int(attrs.get("qk_matmul_output_mode", 0))
    raw = qk
    cap = float(attrs.get("softcap", 0.0) or 0.0)
    if cap > 0:
        qk = (np.tanh(qk / dtype.type(cap)) * dtype.type(cap)).astype(dtype)
    capped = qk
    scores = (qk + bias).astype(dtype)
    prec = attrs.get("softmax_precision")
    sm_dtype = dt.np_dtype(prec) if prec is not None else dtype
    probs = _softmax_rows(scores.astype(sm_dtype))
    dead = np.isneginf(np.max(bias, axis=-1, keepdims=True, initial=-np.inf))  # every key masked: a zero row
    probs = np.where(dead, np.zeros((), probs.dtype), probs)
    qk_out = {0: raw, 1: capped, 2: scores, 3: probs}.get(mode, raw).astype(dtype)
    qk_out = np.broadcast_to(qk_out, (q.shape[0], q.shape[1], sq, t)).copy()
    y = _matmul(probs.astype(dtype), v, dtype)
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], sq, -1)
    return [y, present_k, present_v, qk_out]


def _attention_rule(ctx: InferCtx) -> list[TensorType]:
    q, k, v = ctx.inputs[:3]
    mask, past_k, past_v, nonpad = (list(ctx.inputs[3:]) + [None] * 4)[:4]
    rank = q.rank
    if rank not in (3, 4) or k.rank != rank or v.rank != rank:
        ctx.error(f"Q, K and V must all be 3-D or all 4-D, got ranks {q.rank}, {k.rank}, {v.rank}")
    b = ctx.unify(ctx.unify(q.shape[0], k.shape[0]), v.shape[0])
    if rank == 4:
        _, hq, sq, d = q.shape
        hkv = ctx.unify(k.shape[1], v.shape[1])
        skv = ctx.unify(k.shape[2], v.shape[2])
        ctx.unify(d, k.shape[3])
        dv = v.shape[3]
    else:
        hq, hkv = heads_attr(ctx, "q_num_heads"), heads_attr(ctx, "kv_num_heads")
        sq = q.shape[1]
        skv = ctx.unify(k.shape[1], v.shape[1])
        d = exact_div(ctx, q.shape[2], hq, "Q's hidden size over q_num_heads")
        ctx.unify(d, exact_div(ctx, k.shape[2], hkv, "K's hidden size over kv_num_heads"))
        dv = exact_div(ctx, v.shape[2], hkv, "V's hidden size over kv_num_heads")
    if is_static(hkv) and is_static(hq):
        if hq % hkv:
            ctx.error(f"q_num_heads ({hq}) must be a multiple of kv_num_heads ({hkv})")
    elif is_static(hkv) and int(hkv) > 1:
        ctx.require(divides(int(hkv), hq))
    total = skv
    if (past_k is None) != (past_v is None):
        ctx.error("past_key and past_value must be given together")
    if past_k is not None:
        if nonpad is not None:
            ctx.error("nonpad_kv_seqlen cannot be combined with past_key / past_value")
        for p, last in ((past_k, d), (past_v, dv)):
            if p.rank != 4:
                ctx.error(f"past_key / past_value must be 4-D (B, kv_num_heads, past, head_size), got {p.shape}")
            ctx.unify(p.shape[0], b)
            ctx.unify(p.shape[1], hkv)
            ctx.unify(p.shape[3], last)
        past = ctx.unify(past_k.shape[2], past_v.shape[2])
        total = past + skv
    if mask is not None:
        if mask.rank < 1 or mask.rank > 4:
            ctx.error(f"attn_mask must have rank 1 to 4, got {mask.shape}")
        lead = (b, hq, sq)[4 - mask.rank:] if mask.rank > 1 else ()
        ctx.broadcast(tuple(mask.shape[:-1]), lead)
        last = mask.shape[-1]
        if is_static(last) and is_static(total):
            if last > total:
                ctx.error(f"attn_mask's last dim {last} exceeds the total sequence length {total}")
        else:
            ctx.require(last <= total)
    if nonpad is not None:
        if nonpad.rank != 1:
            ctx.error(f"nonpad_kv_seqlen must be 1-D (batch_size,), got {nonpad.shape}")
        ctx.unify(nonpad.shape[0], b)
    y = (b, hq, sq, dv) if rank == 4 else (b, sq, hq * dv)
    return [TensorType(q.dtype, y), TensorType(k.dtype, (b, hkv, total, d)),
            TensorType(v.dtype, (b, hkv, total, dv)), TensorType(q.dtype, (b, hq, sq, total))]


register("Attention", reference=_attention_ref, infer=_attention_rule)


# ---------------------------------------------------------------------------------------------------------
# FlexAttention (ai.onnx.preview): attention with score / probability modifier subgraphs
# ---------------------------------------------------------------------------------------------------------
def _flex_dtype(dtype: np.dtype, prec: int | None) -> np.dtype:
    """Softmax precision: the attribute, else float64 for double inputs and float32 for the rest."""
    if prec is not None:
        return dt.np_dtype(prec)
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _flex_ref(inputs: list, attrs: dict) -> list:
    from dynshape.ir.execute import run_subgraph

    q, k, v = inputs[:3]
    scale = attrs.get("scale")
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[3])
    if q.shape[1] != k.shape[1]:
        groups = q.shape[1] // k.shape[1] if k.shape[1] else 0
        k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    s = np.asarray(np.sqrt(np.float32(scale))).astype(q.dtype)
    cd = _flex_dtype(q.dtype, attrs.get("softmax_precision"))
    scores = _matmul(q * s, np.swapaxes(k * s, -1, -2), q.dtype).astype(cd)
    scope, env = attrs.get("_scope", {}), attrs.get("_env", {})
    if attrs.get("score_mod") is not None:
        scores = np.asarray(run_subgraph(attrs["score_mod"], [scores], scope, env)[0], dtype=cd)
    probs = _softmax_rows(scores)
    if attrs.get("prob_mod") is not None:
        probs = np.asarray(run_subgraph(attrs["prob_mod"], [probs], scope, env)[0], dtype=cd)
    acc = np.promote_types(cd, np.float32)
    y = np.matmul(probs.astype(acc), v.astype(acc))
    return [y.astype(v.dtype)]


def _flex_rule(ctx: InferCtx) -> list[TensorType]:
    q, k, v = ctx.inputs[:3]
    if q.rank != 4 or k.rank != 4 or v.rank != 4:
        ctx.error(f"FlexAttention needs 4-D Q, K, V, got {q.shape}, {k.shape}, {v.shape}")
    b = ctx.unify(ctx.unify(q.shape[0], k.shape[0]), v.shape[0])
    hkv = ctx.unify(k.shape[1], v.shape[1])
    skv = ctx.unify(k.shape[2], v.shape[2])
    ctx.unify(q.shape[3], k.shape[3])
    hq, sq = q.shape[1], q.shape[2]
    if is_static(hq) and is_static(hkv) and hq % hkv:
        ctx.error(f"Q's heads ({hq}) must be a multiple of K's ({hkv})")
    cd = _flex_dtype(q.dtype, ctx.attr("softmax_precision"))
    scores = TensorType(cd, (b, hq, sq, skv))
    for name in ("score_mod", "prob_mod"):
        g = ctx.attr(name)
        if g is not None:
            (out,) = ctx.infer_subgraph(g, [scores])
            if not isinstance(out, TensorType) or out.rank != 4:
                ctx.error(f"{name} must return one rank-4 tensor, got {out}")
    return [TensorType(q.dtype, (b, hq, sq, v.shape[3]))]


register("FlexAttention", reference=_flex_ref, infer=_flex_rule, domain="ai.onnx.preview")


# ---------------------------------------------------------------------------------------------------------
# RotaryEmbedding
# ---------------------------------------------------------------------------------------------------------
def _rotary_ref(inputs: list, attrs: dict) -> list:
    x, cos, sin = inputs[:3]
    pos = inputs[3] if len(inputs) > 3 else None
    shape = x.shape
    if x.ndim == 4:  # (B, H, S, D) -> (B, S, H, D)
        x = x.transpose(0, 2, 1, 3)
    else:
        heads = attrs["num_heads"]
        x = x.reshape(shape[0], shape[1], heads, shape[2] // heads)
    d = x.shape[3]
    rd = attrs.get("rotary_embedding_dim", 0) or d
    rot, rest = x[..., :rd], x[..., rd:]
    if pos is not None:
        cos, sin = cos[pos], sin[pos]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    if attrs.get("interleaved", 0):
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., : rd // 2], rot[..., rd // 2:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if attrs.get("interleaved", 0):
        rot = np.stack([real, imag], axis=-1).reshape(rot.shape)
    else:
        rot = np.concatenate([real, imag], axis=-1)
    y = np.concatenate([rot, rest], axis=-1).astype(x.dtype)
    return [y.transpose(0, 2, 1, 3) if len(shape) == 4 else y.reshape(shape)]


def _rotary_rule(ctx: InferCtx) -> list[TensorType]:
    x, cos, sin = ctx.inputs[:3]
    pos = ctx.inputs[3] if len(ctx.inputs) > 3 else None
    if x.rank == 4:
        b, _, s, d = x.shape
    elif x.rank == 3:
        b, s, hidden = x.shape
        d = exact_div(ctx, hidden, heads_attr(ctx, "num_heads"), "the hidden size over num_heads")
    else:
        ctx.error(f"X must be 3-D (B, S, hidden) or 4-D (B, H, S, head_size), got {x.shape}")
    rd = ctx.attr("rotary_embedding_dim", 0) or d
    half = exact_div(ctx, rd, 2, "the rotary dim over 2")
    if is_static(rd) and is_static(d) and rd > d:
        ctx.error(f"rotary_embedding_dim {rd} exceeds the head size {d}")
    for c in (cos, sin):
        if c.dtype != x.dtype:
            ctx.error(f"cos/sin caches must have X's dtype {x.dtype}, got {c.dtype}")
        if pos is not None:
            if c.rank != 2:
                ctx.error(f"with position_ids the caches are 2-D (max_position, rotary_dim/2), got {c.shape}")
        else:
            if c.rank != 3:
                ctx.error(f"without position_ids the caches are 3-D (B, S, rotary_dim/2), got {c.shape}")
            ctx.unify(c.shape[0], b)
            ctx.unify(c.shape[1], s)
        ctx.unify(c.shape[-1], half)
    if pos is not None:
        if pos.rank != 2:
            ctx.error(f"position_ids must be 2-D (B, S), got {pos.shape}")
        ctx.unify(pos.shape[0], b)
        ctx.unify(pos.shape[1], s)
    return [TensorType(x.dtype, x.shape)]


register("RotaryEmbedding", reference=_rotary_ref, infer=_rotary_rule)
