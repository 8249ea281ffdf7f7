"""Which sgemm should generated code call?  GFLOP/s at the shapes bert_small needs, 1 and 2 threads.

Candidates, all in one process and table:
  numpy      np.matmul(a, b, out=c) from Python (the baseline; numpy's OpenBLAS + Python dispatch)
  openblas   numpy's OpenBLAS ILP64 cblas_sgemm called from C through dynshape's ds_sgemm (the portable path)
  mkl        MKL (pip install mkl) cblas_sgemm_64 from C; batched shapes use cblas_sgemm_batch_strided_64
  mkl-loop   MKL, batched shapes as a C loop of sgemm calls (what OpenBLAS gets: its strided batch crashes)
  packed     dynshape's own micro-kernels on pre-packed weights (codegen/packed_gemm.py; weight shapes only)

Each (shape, threads) cell is the median over --rounds rounds; a round times every candidate on every shape
(blocks of calls lasting about --sample-ms after a warm-up), so machine noise hits all of them alike.
Run: python bench/gemm_bench.py [--threads 1,2] [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import statistics
import time

import numpy as np

from dynshape.codegen import blas, cc, packed_gemm

HARNESS = (
    '#include "ds_blas.h"\n'
    + r"""
#include <time.h>
/* Seconds for `reps` back-to-back calls, measured inside C so no Python overhead is counted. */
double ds_time_gemm(int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                    const float *a, const float *b, float *c, int64_t reps) {
    int64_t lda = ta ? m : k, ldb = tb ? k : n;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t r = 0; r < reps; r++) {
        if (batch == 1) ds_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
        else ds_sgemm_batched(ta, tb, batch, m, n, k, 1.0f, a, lda, m * k, b, ldb, k * n, 0.0f, c, n, m * n);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}
"""
    + '#include "ds_gemm.c"\n'
    + r"""
/* dynshape's own kernel on weights packed by pack_b (what a fused product by a constant matrix runs). */
double ds_time_packed(const float *a, const float *bp, float *c, int64_t m, int64_t n, int64_t k, int64_t reps) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t r = 0; r < reps; r++) ds_gemm_packed(a, k, bp, c, n, m, n, k);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}
"""
)

# (batch, seq) pairs: the fixed shapes of shared/bench plus the stream's median seq 64.
PAIRS = [(1, 16), (1, 64), (1, 128), (8, 128), (1, 512), (8, 512)]
HEADS, HIDDEN, FFN, HEAD_DIM = 4, 256, 1024, 64


def workloads(pairs: list[tuple[int, int]]) -> list[tuple[str, int, int, int, int, int, int]]:
    """(label, trans_b, batch, m, n, k): the five GEMM kinds of one bert_small layer."""
    out = []
    for b, s in pairs:
        bs = f"b{b}s{s}"
        out += [
            (f"qkv/out  {bs}", 0, 1, b * s, HIDDEN, HIDDEN),
            (f"ffn-up   {bs}", 0, 1, b * s, FFN, HIDDEN),
            (f"ffn-down {bs}", 0, 1, b * s, HIDDEN, FFN),
            (f"q@kT     {bs}", 1, b * HEADS, s, s, HEAD_DIM),
            (f"p@v      {bs}", 0, b * HEADS, s, HEAD_DIM, s),
        ]
    return out


class Case:
    """One GEMM shape with its operands, runnable by every candidate."""

    def __init__(self, label: str, tb: int, batch: int, m: int, n: int, k: int, rng: np.random.Generator):
        self.label, self.tb, self.batch, self.m, self.n, self.k = label, tb, batch, m, n, k
        self.a = rng.standard_normal((batch, m, k), dtype=np.float32)
        self.b = rng.standard_normal((batch, n, k) if tb else (batch, k, n), dtype=np.float32)
        self.c = np.empty((batch, m, n), np.float32)
        a2, b2 = (self.a[0], self.b[0]) if batch == 1 else (self.a, self.b)
        self.a_np, self.b_np = a2, (b2.swapaxes(-1, -2) if tb else b2)
        self.c_np = self.c[0] if batch == 1 else self.c
        self.flop = 2.0 * batch * m * n * k
        self.bp = packed_gemm.pack_b(self.b[0], trans=bool(tb)) if batch == 1 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sample-ms", type=float, default=15.0)
    ap.add_argument("--settle-s", type=float, default=0.5, help="pause when switching library (idle pools)")
    ap.add_argument("--json", help="write the medians here")
    args = ap.parse_args()

    lib = cc.compile_c(HARNESS, "gemm_bench", symbols=["ds_time_gemm", "ds_bind_blas"], openmp=True)
    timer = lib.ds_time_gemm
    I64, P = ctypes.c_int64, ctypes.c_void_p
    timer.argtypes = [ctypes.c_int, ctypes.c_int, I64, I64, I64, I64, P, P, P, I64]
    timer.restype = ctypes.c_double
    ptimer = lib.ds_time_packed
    ptimer.argtypes, ptimer.restype = [P, P, P, I64, I64, I64, I64], ctypes.c_double

    ob, mk = blas.openblas(), blas.mkl()
    libs = [ob] + ([mk] if mk else [])
    # candidates grouped by library: a library switch happens twice a round, after a settle pause, because a
    # pool that just worked keeps spinning for a while and would steal the cores from the other one.
    groups = [(ob, ["numpy", "openblas", "packed"])] + ([(mk, ["mkl", "mkl-loop"])] if mk else [])
    names = [nm for _, g in groups for nm in g]
    rng = np.random.default_rng(0)
    cases = [Case(*w, rng) for w in workloads(PAIRS)]
    results: dict[str, dict[str, float]] = {}

    def run(name: str, cs: Case, reps: int) -> float:
        if name == "packed":
            if cs.bp is None:
                return float("nan")
            return ptimer(cs.a.ctypes.data, cs.bp.ctypes.data, cs.c.ctypes.data, cs.m, cs.n, cs.k, reps)
        if name == "numpy":
            t0 = time.perf_counter()
            for _ in range(reps):
                np.matmul(cs.a_np, cs.b_np, out=cs.c_np)
            return time.perf_counter() - t0
        return timer(0, cs.tb, cs.batch, cs.m, cs.n, cs.k, cs.a.ctypes.data, cs.b.ctypes.data,
                     cs.c.ctypes.data, reps)

    def select(name: str) -> None:
        lb = ob if name in ("numpy", "openblas") else mk
        assert lb is not None
        blas.bind(lib, dataclasses.replace(lb, sgemm_strided=lb.sgemm_strided if name == "mkl" else 0))

    for cs in cases:  # correctness once per shape and candidate
        ref = np.matmul(cs.a_np, cs.b_np)
        for name in names:
            select(name)
            cs.c[...] = np.nan
            if run(name, cs, 1) != run(name, cs, 1):  # NaN: the candidate does not cover this shape
                continue
            assert np.allclose(cs.c_np, ref, rtol=1e-4, atol=1e-3 * np.sqrt(cs.k)), (name, cs.label)

    from threadpoolctl import threadpool_limits

    for nthreads in [int(t) for t in args.threads.split(",")]:
        threadpool_limits(nthreads, user_api="openmp")  # the packed kernel's OpenMP team
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for lb, group in groups:
                for other in libs:  # only the measured library may use threads
                    other.set_num_threads(nthreads if other is lb else 1)
                time.sleep(args.settle_s)
                for name in group:
                    select(name)
                    for cs in cases:
                        if name == "packed" and cs.bp is None:
                            samples.setdefault((cs.label, name), []).append(float("nan"))
                            continue
                        once = max(run(name, cs, 3) / 3, 1e-7)
                        reps = max(1, int(args.sample_ms * 1e-3 / once))
                        samples.setdefault((cs.label, name), []).append(cs.flop * reps / run(name, cs, reps) / 1e9)
        print(f"\n== {nthreads} thread(s); GFLOP/s, median of {args.rounds} rounds "
              f"(openblas {ob.path.rsplit('/', 1)[-1]}{', mkl ' + mk.path.rsplit('/', 1)[-1] if mk else ''})")
        print(f"{'shape':22s}" + "".join(f"{n:>10s}" for n in names) + f"{'best/numpy':>12s}")
        for cs in cases:
            med = {nm: statistics.median(samples[(cs.label, nm)]) for nm in names}
            results[f"{nthreads}t {cs.label}"] = med
            best = max(med[nm] for nm in names if nm != "numpy" and med[nm] == med[nm])
            print(f"{cs.label:22s}" + "".join(f"{med[nm]:10.1f}" for nm in names)
                  + f"{best / med['numpy']:11.2f}x")
        cells = [v for key, v in results.items() if key.startswith(f"{nthreads}t ")]
        geo = {nm: float(np.exp(np.nanmean([np.log(v[nm] / v["numpy"]) for v in cells]))) for nm in names}
        print(f"{'geomean vs numpy':22s}" + "".join(f"{geo[nm]:9.2f}x" for nm in names))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
