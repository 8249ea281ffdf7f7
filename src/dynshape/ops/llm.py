"""Decoder building blocks of recent opsets: LinearAttention, CausalConvWithState (opset 27), TensorScatter (24).

They carry recurrent or cached state between calls, so their shape rules tie the state's dims to the inputs'
(heads, head sizes, kernel width) exactly: a wrong state shape is a load-time error naming the input, not a
broadcast surprise at run time. References compute in float32 and round once to the output type, as the spec's
sequential recurrence does.
"""

from __future__ import annotations

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType
from dynshape.ops.attention import exact_div, heads_attr
from dynshape.ops.dims import is_static

F32 = np.dtype(np.float32)


# ---------------------------------------------------------------------------------------------------------
# LinearAttention
# ---------------------------------------------------------------------------------------------------------
_RULES = ("linear", "gated", "delta", "gated_delta")


def _heads(x: np.ndarray, h: int) -> np.ndarray:
    """(B, T, H*D) -> (B, H, T, D) in float32."""
    b, t, hd = x.shape
    return x.reshape(b, t, h, hd // h).transpose(0, 2, 1, 3).astype(F32)


def _linear_attention_ref(inputs: list, attrs: dict) -> list:
    q, k, v = inputs[:3]
    past, decay, beta = (list(inputs[3:]) + [None] * 3)[:3]
    rule = attrs.get("update_rule", "gated_delta")
    hq, hkv = attrs["q_num_heads"], attrs["kv_num_heads"]
    b, t, _ = q.shape
    dk, dv = q.shape[2] // hq, v.shape[2] // hkv
    q4, k4, v4 = _heads(q, hq), _heads(k, hkv), _heads(v, hkv)
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated:  # per key dim (B, T, Hkv*dk) or per head (B, T, Hkv)
        if decay.shape[2] not in (hkv, hkv * dk):
            raise ValueError(f"decay's last dim must be kv_num_heads ({hkv}) or kv_num_heads*d_k ({hkv * dk}), "
                             f"got {decay.shape[2]}")
        g4 = _heads(decay, hkv) if decay.shape[2] == hkv * dk else decay.reshape(b, t, hkv, 1).transpose(0, 2, 1, 3)
        g4 = g4.astype(F32)
    if delta:
        if beta.shape[2] not in (hkv, 1):
            raise ValueError(f"beta's last dim must be kv_num_heads ({hkv}) or 1, got {beta.shape[2]}")
        b4 = beta.reshape(b, t, beta.shape[2], 1).transpose(0, 2, 1, 3).astype(F32)
    state = np.zeros((b, hkv, dk, dv), F32) if past is None else past.astype(F32)
    scale = attrs.get("scale", 0.0) or 1.0 / np.sqrt(dk)
    group = hq // hkv
    out = np.zeros((b, hq, t, dv), F32)
    for i in range(t):
        kt, vt = k4[:, :, i], v4[:, :, i]
        if gated:
            state = state * np.exp(g4[:, :, i])[..., None]
        if delta:  # v_t - S^T k_t, after the decay (gated_delta decays first)
            vt = b4[:, :, i] * (vt - np.einsum("bhdm,bhd->bhm", state, kt))
        state = state + kt[..., :, None] * vt[..., None, :]
        read = state if group == 1 else np.repeat(state, group, axis=1)
        out[:, :, i] = scale * np.einsum("bhd,bhdm->bhm", q4[:, :, i], read)
    y = out.transpose(0, 2, 1, 3).reshape(b, t, hq * dv).astype(q.dtype)
    return [y, state.astype(q.dtype if past is None else past.dtype)]


def _linear_attention_rule(ctx: InferCtx) -> list[TensorType]:
    q, k, v = ctx.inputs[:3]
    past, decay, beta = (list(ctx.inputs[3:]) + [None] * 3)[:3]
    rule = ctx.attr("update_rule", "gated_delta")
    if rule not in _RULES:
        ctx.error(f"update_rule must be one of {', '.join(_RULES)}, got {rule!r}")
    hq, hkv = heads_attr(ctx, "q_num_heads"), heads_attr(ctx, "kv_num_heads")
    if hq % hkv:
        ctx.error(f"q_num_heads ({hq}) must be a multiple of kv_num_heads ({hkv})")
    for name, x in (("query", q), ("key", k), ("value", v)):
        if x.rank != 3:
            ctx.error(f"{name} must be 3-D (B, T, H*D), got {x.shape}")
    b = ctx.unify(ctx.unify(q.shape[0], k.shape[0]), v.shape[0])
    t = ctx.unify(ctx.unify(q.shape[1], k.shape[1]), v.shape[1])
    dk = exact_div(ctx, q.shape[2], hq, "query's hidden size over q_num_heads")
    ctx.unify(k.shape[2], hkv * dk)
    dv = exact_div(ctx, v.shape[2], hkv, "value's hidden size over kv_num_heads")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated != (decay is not None):
        ctx.error(f"update_rule {rule!r} {'needs' if gated else 'forbids'} the decay input")
    if delta != (beta is not None):
        ctx.error(f"update_rule {rule!r} {'needs' if delta else 'forbids'} the beta input")
    for name, x, lasts in (("decay", decay, (hkv, hkv * dk)), ("beta", beta, (hkv, 1))):
        if x is None:
            continue
        if x.rank != 3:
            ctx.error(f"{name} must be 3-D (B, T, ...), got {x.shape}")
        ctx.unify(x.shape[0], b)
        ctx.unify(x.shape[1], t)
        last = x.shape[2]
        if not is_static(last):
            continue  # one of two layouts; the output shape does not depend on which, the reference checks it
        if last != lasts[0]:
            if is_static(lasts[1]):
                if last != lasts[1]:
                    ctx.error(f"{name}'s last dim must be {lasts[0]} or {lasts[1]}, got {last}")
            else:
                ctx.unify(last, lasts[1])
    state_dtype = q.dtype
    if past is not None:
        if past.rank != 4:
            ctx.error(f"past_state must be 4-D (B, kv_num_heads, d_k, d_v), got {past.shape}")
        for axis, d in enumerate((b, hkv, dk, dv)):
            ctx.unify(past.shape[axis], d)
        state_dtype = past.dtype
    return [TensorType(q.dtype, (b, t, hq * dv)), TensorType(state_dtype, (b, hkv, dk, dv))]


register("LinearAttention", reference=_linear_attention_ref, infer=_linear_attention_rule)


# ---------------------------------------------------------------------------------------------------------
# CausalConvWithState: depthwise causal conv1d whose left padding is the carried state
# ---------------------------------------------------------------------------------------------------------
def _causal_conv_ref(inputs: list, attrs: dict) -> list:
    x, w = inputs[:2]
    bias, past = (list(inputs[2:]) + [None] * 2)[:2]
    b, c, n = x.shape
    kw = w.shape[2]
    pad = np.zeros((b, c, kw - 1), x.dtype) if past is None else past
    full = np.concatenate([pad, x], axis=2)
    xf, wf = full.astype(F32), w.astype(F32)[:, 0, :]
    y = np.zeros((b, c, n), F32)
    for j in range(kw):  # y[t] = sum_j w[j] * full[t + j]
        y += wf[None, :, j, None] * xf[:, :, j:j + n]
    if bias is not None:
        y += bias.astype(F32)[None, :, None]
    y = y.astype(x.dtype)
    if attrs.get("activation", "none") in ("silu", "swish"):
        yf = y.astype(F32)
        y = (yf / (1 + np.exp(-yf))).astype(x.dtype)
    return [y, full[:, :, full.shape[2] - (kw - 1):]]


def _causal_conv_rule(ctx: InferCtx) -> list[TensorType]:
    x, w = ctx.inputs[:2]
    bias, past = (list(ctx.inputs[2:]) + [None] * 2)[:2]
    act = ctx.attr("activation", "none")
    if act not in ("none", "silu", "swish"):
        ctx.error(f"activation must be 'none', 'silu' or 'swish', got {act!r}")
    if x.rank != 3 or w.rank != 3:
        ctx.error(f"input and weight must be 3-D ((B, C, L) and (C, 1, k)), got {x.shape} and {w.shape}")
    b, c, n = x.shape
    c = ctx.unify(c, w.shape[0])
    ctx.unify(w.shape[1], 1)
    kw = w.shape[2]
    if is_static(kw) and kw < 1:
        ctx.error(f"the kernel width must be >= 1, got {kw}")
    if not is_static(kw):
        ctx.require(kw >= 1)
    if bias is not None:
        if bias.rank != 1:
            ctx.error(f"bias must be 1-D (C,), got {bias.shape}")
        ctx.unify(bias.shape[0], c)
    if past is not None:
        if past.rank != 3:
            ctx.error(f"past_state must be 3-D (B, C, k - 1), got {past.shape}")
        ctx.unify(past.shape[0], b)
        ctx.unify(past.shape[1], c)
        ctx.unify(past.shape[2], kw - 1)
    return [TensorType(x.dtype, (b, c, n)), TensorType(x.dtype, (b, c, kw - 1))]


register("CausalConvWithState", reference=_causal_conv_ref, infer=_causal_conv_rule)


# ---------------------------------------------------------------------------------------------------------
# TensorScatter: write an update into a fixed-size cache along `axis`, per batch offset
# ---------------------------------------------------------------------------------------------------------
def _tensor_scatter_ref(inputs: list, attrs: dict) -> list:
    past, upd = inputs[:2]
    idx = inputs[2] if len(inputs) > 2 else None
    axis = attrs.get("axis", -2) % past.ndim
    circular = attrs.get("mode", "linear") == "circular"
    out = past.copy()
    m, s = past.shape[axis], upd.shape[axis]
    starts = np.zeros(past.shape[0], np.int64) if idx is None else idx.astype(np.int64).reshape(-1)
    for bi in range(past.shape[0]):
        pos = starts[bi] + np.arange(s)
        if circular:
            pos = pos % m if m else pos
        elif s and (pos[0] < 0 or pos[-1] >= m):
            raise ValueError(f"TensorScatter: batch {bi} writes positions {pos[0]}..{pos[-1]} outside [0, {m}) "
                             "(linear mode)")
        dst = np.moveaxis(out[bi], axis - 1, 0)
        dst[pos] = np.moveaxis(upd[bi], axis - 1, 0)
    return [out]


def _tensor_scatter_rule(ctx: InferCtx) -> list[TensorType]:
    past, upd = ctx.inputs[:2]
    idx = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    if ctx.attr("mode", "linear") not in ("linear", "circular"):
        ctx.error(f"mode must be 'linear' or 'circular', got {ctx.attr('mode')!r}")
    if past.rank != upd.rank or past.rank < 2:
        ctx.error(f"past_cache and update must have one rank >= 2, got {past.shape} and {upd.shape}")
    if upd.dtype != past.dtype:
        ctx.error(f"update has dtype {upd.dtype}, past_cache {past.dtype}")
    rank = past.rank
    axis = ctx.attr("axis", -2)
    if not -rank <= axis < rank or axis % rank == 0:
        ctx.error(f"axis {axis} must name a non-batch axis of a rank-{rank} cache")
    axis %= rank
    shape = list(past.shape)
    for a in range(rank):
        if a == axis:
            m, s = past.shape[a], upd.shape[a]
            if is_static(m) and is_static(s):
                if s > m:
                    ctx.error(f"the update's sequence length {s} exceeds the cache's {m}")
            else:
                ctx.require(s <= m)
        else:
            shape[a] = ctx.unify(past.shape[a], upd.shape[a])
    if idx is not None:
        if idx.rank != 1:
            ctx.error(f"write_indices must be 1-D (batch_size,), got {idx.shape}")
        ctx.unify(idx.shape[0], shape[0])
    return [TensorType(past.dtype, tuple(shape))]


register("TensorScatter", reference=_tensor_scatter_ref, infer=_tensor_scatter_rule)
