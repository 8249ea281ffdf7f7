import ctypes

import numpy as np
import pytest

from dynshape.codegen import blas, cc
from dynshape.errors import DynshapeError
from dynshape.options import Options
from tolerance import assert_f32_close

DRIVER = (
    '#include "ds_blas.h"\n'
    + r"""
void gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
          const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    ds_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm_batched(int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, const float *a, int64_t sa,
                  const float *b, int64_t sb, float *c) {
    ds_sgemm_batched(ta, tb, batch, m, n, k, 1.0f, a, ta ? m : k, sa, b, tb ? k : n, sb, 0.0f, c, n, m * n);
}
"""
)
I64, P, F = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


@pytest.fixture(scope="module", params=[b.name for b in blas.available()])
def lib(request: pytest.FixtureRequest) -> ctypes.CDLL:
    # One library per BLAS: the pointers live in the library's statics.
    lib = cc.compile_c(DRIVER + f"/* {request.param} */\n", "blas_driver", symbols=["ds_bind_blas"])
    blas.bind(lib, blas.get(request.param))
    lib.gemm.argtypes = [ctypes.c_int, ctypes.c_int, I64, I64, I64, F, P, I64, P, I64, F, P, I64]
    lib.gemm_batched.argtypes = [ctypes.c_int, ctypes.c_int, I64, I64, I64, I64, P, I64, P, I64, P]
    return lib


def _gemm(lib, a, b, c, ta, tb, alpha=1.0, beta=0.0):  # noqa: ANN001, ANN202
    m, n = c.shape
    k = a.shape[0] if ta else a.shape[1]
    lib.gemm(ta, tb, m, n, k, alpha, a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1], beta,
             c.ctypes.data, n)


@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
def test_sgemm_matches_numpy(lib: ctypes.CDLL, ta: int, tb: int) -> None:
    rng = np.random.default_rng(ta * 2 + tb)
    m, n, k = 37, 19, 53
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
    c0 = rng.standard_normal((m, n), dtype=np.float32)
    c = c0.copy()
    _gemm(lib, a, b, c, ta, tb, alpha=0.5, beta=2.0)
    ref = 0.5 * (a.T if ta else a).astype(np.float64) @ (b.T if tb else b) + 2.0 * c0
    assert_f32_close(c, ref, rtol=1e-5, scale=1e-5)


@pytest.mark.parametrize("m,n,k", [(0, 5, 3), (4, 0, 3), (4, 5, 0), (1, 1, 1)])
def test_degenerate_sizes(lib: ctypes.CDLL, m: int, n: int, k: int) -> None:
    a = np.ones((m, k), np.float32)
    b = np.ones((k, n), np.float32)
    for beta in (0.0, 3.0):
        c = np.full((m, n), np.nan if beta == 0.0 else 2.0, np.float32)  # beta=0 must overwrite NaN
        _gemm(lib, a, b, c, 0, 0, beta=beta)
        expect = np.full((m, n), k + (6.0 if beta else 0.0), np.float32)
        np.testing.assert_array_equal(c, expect)


@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("broadcast_b", [False, True])
def test_batched(lib: ctypes.CDLL, tb: int, broadcast_b: bool) -> None:
    rng = np.random.default_rng(7)
    batch, m, n, k = 6, 9, 11, 16
    a = rng.standard_normal((batch, m, k), dtype=np.float32)
    b = rng.standard_normal((1 if broadcast_b else batch, *((n, k) if tb else (k, n))), dtype=np.float32)
    c = np.full((batch, m, n), np.nan, np.float32)
    lib.gemm_batched(0, tb, batch, m, n, k, a.ctypes.data, m * k, b.ctypes.data, 0 if broadcast_b else k * n,
                     c.ctypes.data)
    assert_f32_close(c, a @ (b.swapaxes(1, 2) if tb else b), rtol=1e-5, scale=1e-5)


def test_thread_control() -> None:
    for lb in blas.available():
        with lb.threads(1):
            assert lb.num_threads() == 1
        before = lb.num_threads()
        with lb.threads(2):
            assert lb.num_threads() == 2
        assert lb.num_threads() == before


def test_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    assert blas.get("openblas") is blas.openblas()
    assert blas.openblas().sgemm != 0
    with pytest.raises(DynshapeError, match="unknown BLAS"):
        blas.get("atlas")
    monkeypatch.setenv("DYNSHAPE_BLAS", "openblas")  # the environment fills the option's default
    assert blas.resolve(Options().blas).name == "openblas"
    monkeypatch.delenv("DYNSHAPE_BLAS")
    assert Options().blas == "auto"
    assert blas.resolve("auto").name == ("mkl" if blas.mkl() else "openblas")


@pytest.mark.parametrize("case", [
    ("matmul", (5, 70, 64), (5, 64, 90), 0, 0),  # a batch of at least the team: one product a thread
    ("matmul", (301, 128), (128, 97), 0, 0),  # one product: row blocks, the last one shorter
    ("matmul", (3, 257, 40), (40, 60), 0, 0),  # one B for every batch entry (stride 0)
    ("gemm", (64, 301), (97, 64), 1, 1),  # op(A) = A^T: its rows are A's columns
    ("gemm", (301, 64), (97, 64), 0, 1),
])
def test_products_split_over_the_openmp_team_with_openblas(case) -> None:
    """With numpy's OpenBLAS and an OpenMP team of two, a product large enough runs as row blocks (or batch
    entries) on the team, each a single-threaded sgemm (csrc/ds_matmul.c): the values of one call, a Gemm's beta
    and C included, and OpenBLAS's own thread count put back after (it ran two threads of its own beside the
    team's, which then waited for a descheduled thread: BEiT at 224x224 18 ms at one thread, 58 at two)."""
    from threadpoolctl import threadpool_limits

    from dynshape.codegen import gemm

    mm = gemm.kernel()
    if mm is None or mm.blas != "openblas":
        pytest.skip("the products run on MKL here, which shares the kernels' OpenMP pool")
    kind, sa, sb, ta, tb = case
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    with threadpool_limits(2):
        before = blas.openblas().num_threads()
        if kind == "matmul":
            got, want = gemm.matmul(a, b), a.astype(np.float64) @ b.astype(np.float64)
        else:
            c = rng.standard_normal((1, sb[0] if tb else sb[1])).astype(np.float32)
            got = gemm.gemm(a, b, c, 0.5, 2.0, ta, tb)
            want = 0.5 * ((a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)) + 2.0 * c
        assert blas.openblas().num_threads() == before == 2
    assert_f32_close(got, want.astype(np.float32), rtol=1e-5, scale=1e-4)
