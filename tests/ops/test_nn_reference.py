"""Tricky ONNX semantics of the nn references (opset-dependent axes, stats outputs, zero points)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import dynshape.ops.nn  # noqa: F401  (registers the ops)
from dynshape.ir.opdef import lookup as get


def ref(op: str, *inputs, **attrs):
    attrs.setdefault("_opset", 21)
    return get(op).reference(list(inputs), attrs)


RNG = np.random.default_rng(0)


def test_softmax_before_13_normalizes_the_flattened_tail() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    (old,) = ref("Softmax", x, axis=1, _opset=11)
    (new,) = ref("Softmax", x, axis=1, _opset=13)
    np.testing.assert_allclose(old.sum(axis=(1, 2)), 1, rtol=1e-6)  # one distribution per row of (2, 12)
    np.testing.assert_allclose(new.sum(axis=1), 1, rtol=1e-6)  # one distribution per (n, k)
    e = np.exp(x.astype(np.float64))
    np.testing.assert_allclose(old, e / e.sum(axis=(1, 2), keepdims=True), rtol=1e-5)


def test_log_softmax_of_large_numbers_is_finite() -> None:
    x = np.array([[1000.0, 1001.0, 1002.0]], np.float32)
    (y,) = ref("LogSoftmax", x)
    z = np.array([0.0, 1.0, 2.0])
    np.testing.assert_allclose(y[0], z - np.log(np.exp(z).sum()), rtol=1e-5)


def test_hardmax_marks_first_maximum_only() -> None:
    x = np.array([[1, 3, 3], [2, 2, 0]], np.float32)
    (y,) = ref("Hardmax", x)
    assert y.tolist() == [[0, 1, 0], [1, 0, 0]]


def test_layer_norm_stats_shapes_and_stash_precision() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float16)
    w, b = np.ones((3, 4), np.float16), np.zeros((3, 4), np.float16)
    y, mean, inv_std = ref("LayerNormalization", x, w, b, axis=1, epsilon=1e-5)
    assert y.dtype == np.float16 and mean.dtype == np.float32 and mean.shape == (2, 1, 1)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(mean.ravel(), x64.reshape(2, -1).mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(inv_std.ravel(), 1 / np.sqrt(x64.reshape(2, -1).var(axis=1) + 1e-5), rtol=1e-5)


def test_batchnorm_training_updates_running_stats() -> None:
    x = RNG.standard_normal((4, 2, 3)).astype(np.float32)
    s, b = np.ones(2, np.float32), np.zeros(2, np.float32)
    mean, var = np.full(2, 0.5, np.float32), np.full(2, 2.0, np.float32)
    y, run_mean, run_var = ref("BatchNormalization", x, s, b, mean, var, training_mode=1, momentum=0.8)
    bm, bv = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    np.testing.assert_allclose(run_mean, 0.8 * mean + 0.2 * bm, rtol=1e-6)
    np.testing.assert_allclose(run_var, 0.8 * var + 0.2 * bv, rtol=1e-6)
    np.testing.assert_allclose(y.mean(axis=(0, 2)), 0, atol=1e-6)
    (inf,) = ref("BatchNormalization", x, s, b, mean, var)
    np.testing.assert_allclose(inf, (x - 0.5) / np.sqrt(2.0 + 1e-5), rtol=1e-6)


def test_group_norm_scale_per_channel_since_21_per_group_before() -> None:
    x = RNG.standard_normal((1, 4, 3)).astype(np.float32)
    scale = np.array([1, 2, 3, 4], np.float32)
    (y21,) = ref("GroupNormalization", x, scale, np.zeros(4, np.float32), num_groups=2)
    (y18,) = ref("GroupNormalization", x, np.array([1, 3], np.float32), np.zeros(2, np.float32),
                 num_groups=2, _opset=18)
    g = x.reshape(1, 2, 6)
    norm = ((g - g.mean(axis=2, keepdims=True)) / np.sqrt(g.var(axis=2, keepdims=True) + 1e-5)).reshape(x.shape)
    np.testing.assert_allclose(y21, norm * scale[:, None], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y18, norm * np.array([1, 1, 3, 3], np.float32)[:, None], rtol=1e-5, atol=1e-6)


def test_gemm_transposes_and_scalar_bias() -> None:
    a = RNG.standard_normal((4, 3)).astype(np.float32)
    b = RNG.standard_normal((5, 4)).astype(np.float32)
    (y,) = ref("Gemm", a, b, np.array(2.0, np.float32), transA=1, transB=1, alpha=0.5, beta=3.0)
    np.testing.assert_allclose(y, 0.5 * a.T @ b.T + 6.0, rtol=1e-5)


def test_matmul_integer_zero_points() -> None:
    a = np.array([[10, 20], [30, 40]], np.uint8)
    b = np.array([[1, 2], [3, 4]], np.uint8)
    azp, bzp = np.array([10, 30], np.uint8), np.array([1, 2], np.uint8)
    (y,) = ref("MatMulInteger", a, b, azp, bzp)
    expect = (a.astype(np.int64) - azp[:, None]) @ (b.astype(np.int64) - bzp)
    assert y.dtype == np.int32 and y.tolist() == expect.tolist()


def test_einsum_bfloat16_accumulates_in_float32() -> None:
    x = np.full((1, 256), 1.0, ml_dtypes.bfloat16)
    y = np.full((256, 1), 1.0, ml_dtypes.bfloat16)
    (z,) = ref("Einsum", x, y, equation="ij, jk -> ik")
    assert z.dtype == ml_dtypes.bfloat16 and float(z[0, 0]) == 256.0


def test_lp_normalization_zero_vector_stays_zero() -> None:
    x = np.array([[3.0, -4.0], [0.0, 0.0]], np.float32)
    (l1,) = ref("LpNormalization", x, p=1)
    (l2,) = ref("LpNormalization", x)
    np.testing.assert_allclose(l1, [[3 / 7, -4 / 7], [0, 0]], rtol=1e-6)  # |x| summed, not x
    np.testing.assert_allclose(l2, [[0.6, -0.8], [0, 0]], rtol=1e-6)


def test_lrn_matches_the_channel_window_definition() -> None:
    x = RNG.standard_normal((1, 5, 2, 2)).astype(np.float32)
    size, alpha, beta, bias = 4, 0.1, 0.6, 2.0
    (y,) = ref("LRN", x, size=size, alpha=alpha, beta=beta, bias=bias)
    for c in range(5):
        lo, hi = max(0, c - (size - 1) // 2), min(4, c + -(-(size - 1) // 2))
        sq = (x[:, lo:hi + 1].astype(np.float64) ** 2).sum(axis=1)
        np.testing.assert_allclose(y[:, c], x[:, c] / (bias + alpha / size * sq) ** beta, rtol=1e-5)


def test_det_of_a_batch() -> None:
    a = np.array([[[2.0, 1.0], [1.0, 3.0]], [[0.0, 1.0], [1.0, 0.0]]], np.float32)
    (d,) = ref("Det", a)
    assert d.shape == (2,) and d.dtype == np.float32
    np.testing.assert_allclose(d, [m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0] for m in a], rtol=1e-6)
