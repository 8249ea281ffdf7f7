"""MatMul / Gemm through the C entry point: the few-rows path and the BLAS path agree with numpy."""

import numpy as np
import pytest

from dynshape.codegen import gemm
from tolerance import assert_f32_close


@pytest.mark.parametrize("m", [1, 3, 4, 5, 17])
@pytest.mark.parametrize("k,n", [(64, 128), (300, 7), (1, 1)])
def test_matmul_and_gemm_match_numpy(m, k, n):
    rng = np.random.default_rng(m * 1000 + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = rng.standard_normal(n).astype(np.float32)
    ref = a.astype(np.float64) @ b
    tol = dict(rtol=1e-4, atol=1e-4 * np.sqrt(k))
    np.testing.assert_allclose(gemm.matmul(a, b), ref, **tol)
    np.testing.assert_allclose(gemm.gemm(a, np.ascontiguousarray(b.T), c, 0.5, 2.0, 0, 1), 0.5 * ref + 2 * c, **tol)
    np.testing.assert_allclose(gemm.gemm(np.ascontiguousarray(a.T), b, None, 1.0, 1.0, 1, 0), ref, **tol)


def test_batched_and_broadcast_matmul():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    b = rng.standard_normal((2, 3, 8, 4)).astype(np.float32)
    assert_f32_close(gemm.matmul(a, b), a @ b, rtol=1e-5, scale=1e-6)
    w = rng.standard_normal((8, 6)).astype(np.float32)
    assert_f32_close(gemm.matmul(a, w), a @ w, rtol=1e-5, scale=1e-6)
    assert gemm.matmul(a.astype(np.float64), b.astype(np.float64)) is None  # not covered: caller falls back
