"""Proof of concept of dynshape's backend: y = gelu(x @ W + b) as generated C, and the per-call tax.

Part 1 (eta): the kernel comes from one Python template in three flavours: M a runtime int64 argument with
N, K literal constants (what dynshape generates), all dims literal (a static compiler, one build per M),
and all dims runtime.  eta = T(static) / T(dynamic); 1.0 means the dynamic build loses nothing.  numpy
(matmul + bias + scipy's erf) sits beside them.  Kernel times are measured inside C (no Python overhead),
median of --rounds rounds, each round timing every variant in turn.

Part 2 (call tax): what it costs to get from Python into a compiled function, per call, for an empty
kernel with 4 array arguments: ctypes variants, and a 40-line CPython extension ("trampoline") that reads
the arrays through the buffer protocol and calls the entry point with packed pointer/shape arrays.

Run: python bench/codegen_poc.py [--blas mkl|openblas] [--threads 1] [--rounds 7]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from collections.abc import Callable

import numpy as np

from dynshape.codegen import blas, cc, cgen

I64, P = ctypes.c_int64, ctypes.c_void_p


def gelu_linear_source(m: int | None, n: int | None, k: int | None, tag: str) -> str:
    """The template: a None dim becomes a runtime int64_t argument, an int a literal the compiler sees."""
    dims = {"M": m, "N": n, "K": k}
    params = "".join(f"int64_t {d}_, " for d, v in dims.items() if v is None)
    defs = "".join(f"    const int64_t {d} = {d + '_' if v is None else cgen.c_int(v)};\n" for d, v in dims.items())
    return f"""
__attribute__((noinline))
void gelu_linear_{tag}({params}const float *restrict x, const float *restrict w, const float *restrict b,
                       float *restrict y) {{
{defs}    ds_sgemm(0, 0, M, N, K, 1.0f, x, K, w, N, 0.0f, y, N);
    for (int64_t i = 0; i < M; i++) {{
        float *restrict row = y + i * N;
        for (int64_t j = 0; j < N; j++) {{
            float v = row[j] + b[j];
            row[j] = 0.5f * v * (1.0f + ds_erff(v * {cgen.c_float(1 / np.sqrt(2))}));
        }}
    }}
}}

double time_{tag}(int64_t reps, int64_t M_, int64_t N_, int64_t K_, const float *x, const float *w,
                  const float *b, float *y) {{
    struct timespec t0, t1;
    (void)M_; (void)N_; (void)K_;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t r = 0; r < reps; r++)
        gelu_linear_{tag}({"".join(f"{d}_, " for d, v in dims.items() if v is None)}x, w, b, y);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}}
"""


def build(body: str, name: str) -> ctypes.CDLL:
    lib = cc.compile_c(cgen.PRELUDE + "#include \"ds_blas.h\"\n" + "#include <time.h>\n" + body, name)
    return lib


def numpy_gelu_linear() -> Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]:
    try:
        from scipy.special import erf
    except ImportError:  # tanh approximation: not the same function, but the same amount of numpy work
        def erf(v: np.ndarray, out: np.ndarray) -> np.ndarray:
            return np.tanh(v * 1.128379, out=out)

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray, y: np.ndarray) -> None:
        np.matmul(x, w, out=y)
        y += b
        t = np.multiply(y, np.float32(1 / np.sqrt(2)))
        erf(t, out=t)
        t += 1
        y *= t
        y *= np.float32(0.5)

    return run


def part_eta(args: argparse.Namespace, lb: blas.Blas) -> None:
    n, k = args.n, args.k
    dyn = build(gelu_linear_source(None, n, k, "dyn"), "poc_dyn")
    alldyn = build(gelu_linear_source(None, None, None, "alldyn"), "poc_alldyn")
    np_run = numpy_gelu_linear()
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n), dtype=np.float32) / np.float32(np.sqrt(k))
    b = rng.standard_normal(n, dtype=np.float32)
    print(f"\n== eta: y = gelu(x[M,{k}] @ W[{k},{n}] + b), BLAS {lb.name}, {args.threads} thread(s); "
          f"us per call, median of {args.rounds} rounds")
    print(f"{'M':>6s}{'static':>10s}{'dynamic':>10s}{'all-dyn':>10s}{'numpy':>10s}{'eta':>8s}{'np/dyn':>8s}")
    for m in args.m:
        stat = build(gelu_linear_source(m, n, k, "stat"), f"poc_stat_{m}")
        libs = {"static": stat, "dynamic": dyn, "all-dyn": alldyn}
        for lib, tag in ((stat, "stat"), (dyn, "dyn"), (alldyn, "alldyn")):
            blas.bind(lib, lb)
            fn = getattr(lib, f"time_{tag}")
            fn.argtypes, fn.restype = [I64, I64, I64, I64, P, P, P, P], ctypes.c_double
        x = rng.standard_normal((m, k), dtype=np.float32)
        ys = {name: np.empty((m, n), np.float32) for name in [*libs, "numpy"]}
        tags = {"static": "stat", "dynamic": "dyn", "all-dyn": "alldyn"}

        def timed(name: str, reps: int, x: np.ndarray = x, ys: dict = ys, libs: dict = libs,
                  tags: dict = tags, m: int = m) -> float:
            if name == "numpy":
                t0 = time.perf_counter()
                for _ in range(reps):
                    np_run(x, w, b, ys[name])
                return time.perf_counter() - t0
            fn = getattr(libs[name], f"time_{tags[name]}")
            return fn(reps, m, n, k, x.ctypes.data, w.ctypes.data, b.ctypes.data, ys[name].ctypes.data)

        for name in ys:
            timed(name, 1)
        ref = ys["numpy"]
        for name in libs:  # all C flavours agree with each other exactly and with numpy to float accuracy
            np.testing.assert_array_equal(ys[name], ys["dynamic"])
            np.testing.assert_allclose(ys[name], ref, rtol=1e-4, atol=1e-4)
        samples: dict[str, list[float]] = {name: [] for name in ys}
        for _ in range(args.rounds):
            for name in ys:
                once = max(timed(name, 2) / 2, 1e-7)
                reps = max(1, int(args.sample_ms * 1e-3 / once))
                samples[name].append(timed(name, reps) / reps * 1e6)
        med = {name: statistics.median(v) for name, v in samples.items()}
        print(f"{m:6d}" + "".join(f"{med[nm]:10.1f}" for nm in ys)
              + f"{med['static'] / med['dynamic']:8.3f}{med['numpy'] / med['dynamic']:8.2f}")


ENTRIES = r"""
#include <stdint.h>
void noop5(int64_t m, const float *x, const float *w, const float *b, float *y) {
    (void)m; (void)x; (void)w; (void)b; (void)y;
}
void noop_packed(const int64_t *args) { (void)args; }
/* The trampoline's ABI, with the checks a generated entry would do (x: float32 [M, K], w: float32 [K, N]). */
int noop_entry(void *const *ptrs, const int64_t *s) {
    (void)ptrs;
    if (s[0] != 2 || s[2] != 'f' || s[11] != 2 || s[13] != 'f' || s[4] != s[14]) return 1;
    return 0;
}
"""


def part_call_tax(args: argparse.Namespace) -> None:
    lib = cc.compile_c(ENTRIES, "poc_entries")
    pylib = ctypes.PyDLL(cc.build_shared(ENTRIES, "poc_entries"))
    tramp = cc.compile_extension(cc.read_csrc("ds_trampoline.c"), "ds_trampoline")

    m, k, n = 4, 256, 1024
    x, w = np.zeros((m, k), np.float32), np.zeros((k, n), np.float32)
    b, y = np.zeros(n, np.float32), np.zeros((m, n), np.float32)
    f = lib.noop5
    f.argtypes, f.restype = [I64, P, P, P, P], None
    g = pylib.noop5
    g.argtypes, g.restype = [I64, P, P, P, P], None
    raw = lib.noop5  # same function object: make a second handle without argtypes via the address
    raw_fn = ctypes.CFUNCTYPE(None, I64, P, P, P, P)(ctypes.cast(raw, P).value)
    packed = lib.noop_packed
    packed.argtypes, packed.restype = [P], None
    pk = (ctypes.c_int64 * 5)()
    pk_addr = ctypes.addressof(pk)
    px, pw, pb, py = (a.ctypes.data for a in (x, w, b, y))
    entry = ctypes.cast(lib.noop_entry, P).value
    invoke = tramp.invoke
    assert invoke(entry, x, w, b, y) == 0 and invoke(entry, w, x, b, y) == 1

    def packed_call() -> None:
        pk[0] = x.shape[0]
        pk[1] = x.ctypes.data
        pk[2] = w.ctypes.data
        pk[3] = b.ctypes.data
        pk[4] = y.ctypes.data
        packed(pk_addr)

    def ai(a: np.ndarray) -> int:
        return a.__array_interface__["data"][0]

    cases: list[tuple[str, Callable[[], object]]] = [
        ("ctypes CDLL, argtypes, addresses precomputed", lambda: f(m, px, pw, pb, py)),
        ("ctypes PyDLL (GIL kept), addresses precomputed", lambda: g(m, px, pw, pb, py)),
        ("ctypes CFUNCTYPE from address, precomputed", lambda: raw_fn(m, px, pw, pb, py)),
        ("ctypes CDLL + arr.ctypes.data per call", lambda: f(x.shape[0], x.ctypes.data, w.ctypes.data,
                                                             b.ctypes.data, y.ctypes.data)),
        ("ctypes CDLL + __array_interface__ per call", lambda: f(x.shape[0], ai(x), ai(w), ai(b), ai(y))),
        ("ctypes packed int64[5] + .ctypes.data", packed_call),
        ("C trampoline (buffer protocol, shapes, check)", lambda: invoke(entry, x, w, b, y)),
        ("C trampoline + np.empty output", lambda: invoke(entry, x, w, b, np.empty((m, n), np.float32))),
        ("(np.empty((4,1024)) alone)", lambda: np.empty((m, n), np.float32)),
        ("(empty Python lambda call, loop floor)", lambda: None),
    ]
    print(f"\n== call tax: empty kernel, 4 arrays; ns per call, median of {args.rounds} rounds x 100k calls")
    samples: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(args.rounds):
        for name, fn in cases:
            t0 = time.perf_counter()
            for _ in range(100_000):
                fn()
            samples[name].append((time.perf_counter() - t0) / 100_000 * 1e9)
    for name, _ in cases:
        print(f"  {name:48s}{statistics.median(samples[name]):8.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blas", default=None, help="openblas or mkl (default: dynshape's default)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sample-ms", type=float, default=20.0)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--m", type=lambda s: [int(v) for v in s.split(",")], default=[1, 16, 64, 128, 512, 4096])
    ap.add_argument("--skip-eta", action="store_true")
    args = ap.parse_args()
    lb = blas.get(args.blas) if args.blas else blas.default_blas()
    for other in blas.available():
        other.set_num_threads(args.threads if other is lb else 1)
    if not args.skip_eta:
        part_eta(args, lb)
    part_call_tax(args)


if __name__ == "__main__":
    main()
