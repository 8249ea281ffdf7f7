"""Attention, RotaryEmbedding and the decoder ops, against naive loops written from the spec's prose."""

from __future__ import annotations

import numpy as np
import pytest
from nodecase import one_node, run_one

import dynshape as ds
from tolerance import assert_f32_close

rng = np.random.default_rng(0)


def _naive_attention(q, k, v, mask=None, causal=False, past=None, scale=None, softcap=0.0):
    """Per (batch, head, query) loops over 4-D inputs, in float64."""
    if past is not None:
        k = np.concatenate([past[0], k], axis=2)
        v = np.concatenate([past[1], v], axis=2)
    b, hq, sq, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    offset = t - sq if past is not None else 0
    scale = 1 / np.sqrt(d) if scale is None else scale
    y = np.zeros((b, hq, sq, v.shape[3]))
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(sq):
                s = np.array([q[bi, h, i] @ k[bi, kh, j] * scale for j in range(t)], np.float64)
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                allowed = np.ones(t, bool)
                if causal:
                    allowed &= np.arange(t) <= i + offset
                if mask is not None:
                    m = np.broadcast_to(mask, (b, hq, sq, t))[bi, h, i]
                    if m.dtype == bool:
                        allowed &= m
                    else:
                        s = s + m
                if not allowed.any():
                    continue  # a fully masked row is zeros
                s = np.where(allowed, s, -np.inf)
                p = np.exp(s - s.max())
                y[bi, h, i] = (p / p.sum()) @ v[bi, kh]
    return y, k, v


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_gqa_past_and_mask_match_naive_loops(causal: int) -> None:
    b, hq, hkv, sq, skv, p, d, dv = 2, 4, 2, 3, 3, 2, 8, 5
    q = rng.standard_normal((b, hq, sq, d))
    k = rng.standard_normal((b, hkv, skv, d))
    v = rng.standard_normal((b, hkv, skv, dv))
    pk, pv = rng.standard_normal((b, hkv, p, d)), rng.standard_normal((b, hkv, p, dv))
    mask = rng.random((sq, p + skv)) > 0.3
    mask[1] = False  # one query row sees nothing
    y, present_k, present_v, _ = run_one("Attention", {"Q": q, "K": k, "V": v, "attn_mask": mask, "past_key": pk,
                                                        "past_value": pv}, 4, is_causal=causal, softcap=3.0)
    want, wk, wv = _naive_attention(q, k, v, mask, bool(causal), (pk, pv), softcap=3.0)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(present_k, wk)
    np.testing.assert_array_equal(present_v, wv)
    assert not np.isnan(y).any() and (y[:, :, 1] == 0).all()


def test_attention_3d_heads_and_symbolic_shapes() -> None:
    """3-D inputs split their hidden size into heads: the rule records the divisibility it needs."""
    q = rng.standard_normal((2, 3, 4 * 6)).astype(np.float32)
    k = rng.standard_normal((2, 5, 2 * 6)).astype(np.float32)
    v = rng.standard_normal((2, 5, 2 * 7)).astype(np.float32)
    g = one_node("Attention", {"Q": q, "K": k, "V": v}, 4, q_num_heads=4, kv_num_heads=2,
                 dims={"Q": ["b", "s", "hq"], "K": ["b", "t", "hk"], "V": ["b", "t", "hv"]})
    y, pk, _, qk = (g.types[f"out{i}"].shape for i in range(4))
    assert [str(d) for d in y] == ["b", "s", "2*hv"]  # 4 heads of hv/2 each, hv even
    assert [str(d) for d in pk] == ["b", "2", "t", "hq//4"]
    assert {"4 divides hq", "2 divides hv"} <= {f.text for f in g.signature.facts}
    out = g.run({"Q": q, "K": k, "V": v})
    qh = q.reshape(2, 3, 4, 6).transpose(0, 2, 1, 3).astype(np.float64)
    kh = k.reshape(2, 5, 2, 6).transpose(0, 2, 1, 3).astype(np.float64)
    vh = v.reshape(2, 5, 2, 7).transpose(0, 2, 1, 3).astype(np.float64)
    want = _naive_attention(qh, kh, vh)[0].transpose(0, 2, 1, 3).reshape(2, 3, 28)
    assert_f32_close(out["out0"], want, rtol=1e-5, scale=1e-6)
    with pytest.raises(ds.ConstraintViolation, match="divides"):
        g.run({"Q": q[:, :, :22], "K": k, "V": v})


def test_attention_empty_kv_is_all_masked_not_nan() -> None:
    q = rng.standard_normal((1, 2, 3, 4))
    y = run_one("Attention", {"Q": q, "K": np.zeros((1, 2, 0, 4)), "V": np.zeros((1, 2, 0, 5))})[0]
    assert y.shape == (1, 2, 3, 5) and (y == 0).all()


def test_rotary_embedding_rotates_pairs() -> None:
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    theta = rng.standard_normal((5, 2)).astype(np.float32)
    pos = np.array([[4, 0, 2]], np.int64)
    (y,) = run_one("RotaryEmbedding", {"X": x, "cos": np.cos(theta), "sin": np.sin(theta), "pos": pos},
                   interleaved=1)
    for h in range(2):
        for s in range(3):
            for i in range(2):
                a, b = x[0, h, s, 2 * i], x[0, h, s, 2 * i + 1]
                c, sn = np.cos(theta[pos[0, s], i]), np.sin(theta[pos[0, s], i])
                np.testing.assert_allclose(y[0, h, s, 2 * i: 2 * i + 2], [c * a - sn * b, sn * a + c * b], rtol=1e-6)


def test_linear_attention_matches_the_recurrence() -> None:
    b, t, h, dk, dv = 1, 4, 2, 3, 2
    q, k = rng.standard_normal((b, t, h * dk)), rng.standard_normal((b, t, h * dk))
    v, g = rng.standard_normal((b, t, h * dv)), -rng.random((b, t, h))
    q, k, v, g = (x.astype(np.float32) for x in (q, k, v, g))
    y, state = run_one("LinearAttention", {"q": q, "k": k, "v": v, "past": None, "decay": g}, 2, opset=27,
                       q_num_heads=h, kv_num_heads=h, update_rule="gated")
    s = np.zeros((h, dk, dv))
    for i in range(t):
        for hh in range(h):
            kt, vt = k[0, i, hh * dk:(hh + 1) * dk], v[0, i, hh * dv:(hh + 1) * dv]
            s[hh] = np.exp(g[0, i, hh]) * s[hh] + np.outer(kt, vt)
            assert_f32_close(y[0, i, hh * dv:(hh + 1) * dv], q[0, i, hh * dk:(hh + 1) * dk] @ s[hh]
                             / np.sqrt(dk), rtol=1e-5, scale=1e-6)
    assert_f32_close(state[0], s, rtol=1e-5, scale=1e-6)


def test_causal_conv_state_carries_across_calls() -> None:
    """Two calls with the state carried equal one call on the concatenated input."""
    x = rng.standard_normal((2, 3, 7)).astype(np.float32)
    w = rng.standard_normal((3, 1, 4)).astype(np.float32)
    whole, _ = run_one("CausalConvWithState", {"x": x, "w": w}, 2, opset=27)
    a, sa = run_one("CausalConvWithState", {"x": x[:, :, :2], "w": w}, 2, opset=27)
    bb, _ = run_one("CausalConvWithState", {"x": x[:, :, 2:], "w": w, "bias": None, "past": sa}, 2, opset=27)
    assert_f32_close(np.concatenate([a, bb], axis=2), whole, rtol=1e-6, scale=1e-6)


def test_tensor_scatter_circular_wraps() -> None:
    past = np.zeros((2, 1, 4, 1), np.float32)
    upd = np.arange(1, 7, dtype=np.float32).reshape(2, 1, 3, 1)
    (y,) = run_one("TensorScatter", {"past": past, "upd": upd, "idx": np.array([0, 3], np.int64)}, opset=24,
                   mode="circular")
    assert y[0, 0, :, 0].tolist() == [1, 2, 3, 0] and y[1, 0, :, 0].tolist() == [5, 6, 0, 4]
    with pytest.raises(ds.ConstraintViolation, match="outside"):
        run_one("TensorScatter", {"past": past, "upd": upd, "idx": np.array([0, 3], np.int64)}, opset=24)
