import ctypes
import math
import subprocess

import numpy as np
import pytest

from dynshape.codegen import cc, cgen
from dynshape.errors import DynshapeError
from dynshape.sym import ceil_div, max_, min_, sym

I64P = ctypes.POINTER(ctypes.c_int64)


def test_c_type() -> None:
    assert cgen.c_type(np.float32) == "float"
    assert cgen.c_type("int64") == "int64_t"
    assert cgen.c_type(np.bool_) == "uint8_t"
    assert cgen.c_type(np.dtype("float16")) == "_Float16"
    with pytest.raises(DynshapeError, match="no C type"):
        cgen.c_type(np.complex64)


def _literal_bits(dtype: type, values: np.ndarray) -> np.ndarray:
    ctype = cgen.c_type(dtype)
    body = ",\n".join(cgen.c_float(v, dtype) for v in values)
    src = (
        cgen.PRELUDE
        + f"static const {ctype} vals[] = {{\n{body}\n}};\n"
        + f"void get({ctype} *out) {{ for (size_t i = 0; i < {len(values)}; i++) out[i] = vals[i]; }}\n"
    )
    lib = cc.compile_c(src, f"literals_{np.dtype(dtype).name}")
    out = np.empty(len(values), dtype)
    lib.get(ctypes.c_void_p(out.ctypes.data))
    return out


@pytest.mark.parametrize("dtype,uint", [(np.float32, np.uint32), (np.float64, np.uint64)])
def test_float_literals_round_trip(dtype: type, uint: type) -> None:
    rng = np.random.default_rng(1)
    info = np.iinfo(uint)
    bits = rng.integers(0, info.max, 3000, dtype=uint, endpoint=True)
    vals = bits.view(dtype)
    specials = np.array([0.0, -0.0, 1.0, 0.1, 1 / 3, np.finfo(dtype).max, np.finfo(dtype).tiny,
                         np.finfo(dtype).smallest_subnormal, -np.finfo(dtype).smallest_subnormal], dtype)
    vals = np.concatenate([vals[np.isfinite(vals)], specials])
    out = _literal_bits(dtype, vals)
    np.testing.assert_array_equal(out.view(uint), vals.view(uint))
    nonfinite = _literal_bits(dtype, np.array([np.inf, -np.inf, np.nan], dtype))
    assert nonfinite[0] == np.inf and nonfinite[1] == -np.inf and np.isnan(nonfinite[2])
    assert cgen.c_float(-1.5) == "(-1.5e+00f)" and cgen.c_float(-1.5, np.float64) == "(-1.5e+00)"


def test_int_helpers_and_literals() -> None:
    pairs = [(a, b) for a in range(-23, 24) for b in range(-7, 8) if b]
    extremes = [(2**63 - 1, 3), (-(2**63) + 1, 7), (-(2**63) + 1, -7), (10**18, -(10**9))]
    pairs += extremes
    lits = [0, 1, -1, 2**31 - 1, 2**31, -(2**31), 2**63 - 1, -(2**63)]
    src = cgen.PRELUDE + (
        "void run(const int64_t *a, const int64_t *b, int64_t *q, int64_t *r, int64_t n) {\n"
        "  for (int64_t i = 0; i < n; i++) { q[i] = ds_floordiv(a[i], b[i]); r[i] = ds_mod(a[i], b[i]); }\n}\n"
        f"static const int64_t lits[] = {{{', '.join(cgen.c_int(v) for v in lits)}}};\n"
        f"void get_lits(int64_t *out) {{ for (int i = 0; i < {len(lits)}; i++) out[i] = lits[i]; }}\n"
    )
    lib = cc.compile_c(src, "int_helpers")
    a = np.array([p[0] for p in pairs], np.int64)
    b = np.array([p[1] for p in pairs], np.int64)
    q, r = np.empty_like(a), np.empty_like(a)
    lib.run(*(ctypes.c_void_p(x.ctypes.data) for x in (a, b, q, r)), ctypes.c_int64(len(a)))
    assert q.tolist() == [x // y for x, y in pairs]
    assert r.tolist() == [x % y for x, y in pairs]
    out = np.empty(len(lits), np.int64)
    lib.get_lits(ctypes.c_void_p(out.ctypes.data))
    assert out.tolist() == lits
    with pytest.raises(DynshapeError):
        cgen.c_int(2**63)


def test_c_dim_matches_evaluate() -> None:
    n = sym("n", min=1, max=50)
    m = sym("m", min=0)
    k = sym("k", min=8, max=64, multiple_of=8)
    exprs = [
        7,
        n,
        n * m + 3 * k - 7,
        (n - 10) // 3,
        (n - 10) % 3,
        (n - m) // 3,
        (n - m) % 3,
        (n * m + 5) % 7,
        (n * m + 5) // 7,
        ceil_div(n, 4),
        min_(n, m) + max_(k, 2 * n, m - 3),
        (n * k) // (m + 1),
        (10 - n) % k,
        -(n // 2) * (m % 5),
        n**2 * m - k // 8,
        n * 3_000_000_000 + 1,
    ]
    names = {"n": "v_n", "m": "v_m", "k": "v_k"}
    funcs = "".join(
        f"static int64_t e{i}(int64_t v_n, int64_t v_m, int64_t v_k) {{ return {cgen.c_dim(e, names)}; }}\n"
        for i, e in enumerate(exprs)
    )
    calls = "".join(f"    out[i * {len(exprs)} + {i}] = e{i}(n[i], m[i], k[i]);\n" for i in range(len(exprs)))
    src = cgen.PRELUDE + funcs + (
        "void run(const int64_t *n, const int64_t *m, const int64_t *k, int64_t *out, int64_t cnt) {\n"
        f"  for (int64_t i = 0; i < cnt; i++) {{\n{calls}  }}\n}}\n"
    )
    lib = cc.compile_c(src, "dims")
    rng = np.random.default_rng(3)
    envs = {"n": rng.integers(1, 51, 300), "m": rng.integers(0, 200, 300), "k": 8 * rng.integers(1, 9, 300)}
    envs["m"][:5] = 0
    arrs = {s: np.ascontiguousarray(v, np.int64) for s, v in envs.items()}
    out = np.empty((300, len(exprs)), np.int64)
    lib.run(*(ctypes.c_void_p(arrs[s].ctypes.data) for s in "nmk"), ctypes.c_void_p(out.ctypes.data),
            ctypes.c_int64(300))
    for row in range(300):
        env = {s: int(arrs[s][row]) for s in "nmk"}
        want = [e if isinstance(e, int) else e.evaluate(env) for e in exprs]
        assert out[row].tolist() == want, (env, [str(e) for e in exprs])
    # the provably non-negative division by a constant is printed as plain C division
    assert " / 7" in cgen.c_dim((n * m + 5) // 7, names)
    assert "ds_floordiv" in cgen.c_dim((n - m) // 3, names)


def test_c_dim_names_symbols_through_the_mapping_and_refuses_non_dims() -> None:
    """Symbol names never reach C: a kernel reads each symbol from its key array, whatever its name."""
    assert cgen.c_dim(sym("seq-len") + 1, lambda name: "key[3]") == "(key[3] + 1)"
    with pytest.raises(DynshapeError, match="not a dimension"):
        cgen.c_dim(1.5, {})


@pytest.fixture(scope="module")
def mathlib() -> ctypes.CDLL:
    src = cgen.PRELUDE + "".join(
        f"void v_{f}(const float *x, float *y, int64_t n) {{ for (int64_t i = 0; i < n; i++) y[i] = ds_{f}f(x[i]); }}\n"
        for f in ("exp", "erf", "tanh", "exp_nonpos", "sigmoid", "log")
    )
    lib = cc.compile_c(src.replace("ds_exp_nonposf(", "ds_expf_nonpos("), "fastmath")
    for f in ("exp", "erf", "tanh", "exp_nonpos", "sigmoid", "log"):
        getattr(lib, f"v_{f}").argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def _apply(lib: ctypes.CDLL, f: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    getattr(lib, f"v_{f}")(x.ctypes.data, y.ctypes.data, x.size)
    return y


_REF = {"exp": np.exp, "tanh": np.tanh, "erf": np.vectorize(math.erf, otypes=[np.float64])}


@pytest.mark.parametrize("f", ["exp", "erf", "tanh"])
def test_fast_math_accuracy(mathlib: ctypes.CDLL, f: str) -> None:
    mags = np.float32(10.0) ** np.linspace(-30, 2, 40001, dtype=np.float32)
    x = np.concatenate([np.linspace(-110, 110, 400001, dtype=np.float32), mags, -mags])
    y = _apply(mathlib, f, x).astype(np.float64)
    ref = _REF[f](x.astype(np.float64))
    normal = (np.abs(ref) >= np.finfo(np.float32).tiny) & (np.abs(ref) <= np.finfo(np.float32).max)
    rel = np.abs(y[normal] - ref[normal]) / np.abs(ref[normal])
    assert rel.max() < 1e-6, (f, x[normal][np.argmax(rel)], rel.max())
    # outside float32's normal range: overflow to inf, subnormal results within a few subnormal ulps
    assert np.all(np.isinf(y[ref > np.finfo(np.float32).max]))
    small = ~normal & (np.abs(ref) < 1)
    assert np.all(np.abs(y[small] - ref[small]) <= 4 * float(np.finfo(np.float32).smallest_subnormal))


def test_softmax_exp_on_nonpositive_inputs(mathlib: ctypes.CDLL) -> None:
    """ds_expf_nonpos: as accurate as ds_expf down to -87.3, zero below (subnormal results flushed), NaN kept."""
    mags = np.float32(10.0) ** np.linspace(-30, 1.9, 4001, dtype=np.float32)
    x = np.concatenate([np.linspace(-87.3, 0, 200001, dtype=np.float32), -mags])
    y = _apply(mathlib, "exp_nonpos", x).astype(np.float64)
    ref = np.exp(x.astype(np.float64))
    assert (np.abs(y - ref) / ref).max() < 1e-6
    z = _apply(mathlib, "exp_nonpos", np.array([-87.4, -100, -np.inf, np.nan, -0.0], np.float32))
    assert (z[:3] == 0).all() and np.isnan(z[3]) and z[4] == 1.0


def test_sigmoid_accuracy(mathlib: ctypes.CDLL) -> None:
    """ds_sigmoidf: relative error < 1e-6 wherever the logistic is a normal float32 above e^-87.3; below that
    (x < -87.3) an absolute error under 1.3e-38 (0, never a subnormal); 1 for large x; NaN kept."""
    mags = np.float32(10.0) ** np.linspace(-30, 2, 40001, dtype=np.float32)
    x = np.concatenate([np.linspace(-200, 200, 400001, dtype=np.float32), mags, -mags])
    y = _apply(mathlib, "sigmoid", x).astype(np.float64)
    ref = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    main = x >= -87.3
    assert (np.abs(y[main] - ref[main]) / ref[main]).max() < 1e-6
    assert np.abs(y[~main] - ref[~main]).max() < 1.3e-38
    assert ((y == 0) | (y >= np.finfo(np.float32).tiny)).all()
    s = _apply(mathlib, "sigmoid", np.array([np.nan, np.inf, -np.inf, 0.0, 100.0], np.float32))
    assert np.isnan(s[0]) and s[1] == 1.0 and 0 <= s[2] < 1.3e-38 and s[3] == 0.5 and s[4] == 1.0


def test_log_accuracy(mathlib: ctypes.CDLL) -> None:
    """ds_logf: relative error < 1e-6 wherever ln x is not near 0 (absolute < 1e-7 there: x within 1e-6 of 1,
    where float32's own x carries that much), over normal and subnormal x of every exponent; -inf at 0, NaN below
    it and for NaN, inf at inf."""
    rng = np.random.default_rng(0)
    bits = rng.integers(1, 0x7F800000, 2_000_000, dtype=np.int64).astype(np.uint32)  # every positive finite float
    x = np.concatenate([bits.view(np.float32), np.linspace(0.5, 2.0, 300001, dtype=np.float32),
                        np.float32(2.0) ** np.arange(-149, 128, dtype=np.float32)])
    y = _apply(mathlib, "log", x).astype(np.float64)
    ref = np.log(x.astype(np.float64))
    big = np.abs(ref) > 1e-6
    assert (np.abs(y[big] - ref[big]) / np.abs(ref[big])).max() < 1e-6
    assert np.abs(y[~big] - ref[~big]).max() < 1e-7
    s = _apply(mathlib, "log", np.array([0.0, -0.0, -1.0, -np.inf, np.nan, np.inf, 1.0], np.float32))
    assert s[0] == -np.inf and s[1] == -np.inf and np.isnan(s[2:5]).all() and s[5] == np.inf and s[6] == 0.0


def test_fast_math_special_values(mathlib: ctypes.CDLL) -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45], np.float32)
    e, r, t = (_apply(mathlib, f, x) for f in ("exp", "erf", "tanh"))
    assert np.isnan(e[0]) and e[1] == np.inf and e[2] == 0.0 and e[3] == 1.0 and e[4] == 1.0
    assert np.isnan(r[0]) and r[1] == 1.0 and r[2] == -1.0 and r[3] == 0.0
    assert np.signbit(r[4]) and r[5] > 0
    assert np.isnan(t[0]) and t[1] == 1.0 and t[2] == -1.0 and np.signbit(t[4]) and t[5] > 0


def test_libm_prelude_is_interchangeable() -> None:
    src = cgen.prelude(fast_math=False) + ("float e(float x) { return ds_erff(x) + ds_expf(x) + ds_tanhf(x) + "
                                           "ds_logf(x); }\n")
    lib = cc.compile_c(src, "libm_math")
    lib.e.argtypes, lib.e.restype = [ctypes.c_float], ctypes.c_float
    assert lib.e(0.5) == pytest.approx(math.erf(0.5) + math.exp(0.5) + math.tanh(0.5) + math.log(0.5), rel=1e-6)


def test_fast_math_vectorises() -> None:
    """The point of ds_*f over libm: gcc vectorises loops calling them (libm's only under -ffast-math)."""
    argv = cc.find_compiler()
    if "Free Software Foundation" not in subprocess.run([*argv, "--version"], capture_output=True,
                                                        text=True).stdout:
        pytest.skip("vectorisation report checked with gcc only")
    src = cgen.PRELUDE + (
        "void k(const float *restrict x, float *restrict y, int64_t n) {\n"
        "  for (int64_t i = 0; i < n; i++) y[i] = ds_erff(x[i]) + ds_tanhf(x[i]) * ds_expf(x[i]) + ds_logf(x[i]);\n}\n"
    )
    lib = cc.build_shared(src, "vec", flags=[*cc.DEFAULT_FLAGS, "-fopt-info-vec-optimized"])
    proc = subprocess.run([*argv, *cc.DEFAULT_FLAGS, *cc.include_flags(), "-fopt-info-vec-optimized",
                           str(lib.with_suffix(".c")), "-o", "/dev/null"], capture_output=True, text=True)
    assert "loop vectorized" in proc.stderr, proc.stderr


def test_trampoline_passes_pointers_shapes_and_status() -> None:
    tramp = cc.compile_extension(cc.read_csrc("ds_trampoline.c"), "ds_trampoline")
    lib = cc.compile_c(
        "#include <stdint.h>\n#include <string.h>\n"
        "int probe(void *const *p, const int64_t *s) {\n"
        "  int64_t *out = (int64_t *)p[1];\n"
        "  memcpy(out, s, 3 * 11 * sizeof(int64_t));\n"
        "  out[33] = (int64_t)(intptr_t)p[0];\n"
        "  return (int)s[3];\n}\n",
        "tramp_probe",
    )
    entry = ctypes.cast(lib.probe, ctypes.c_void_p).value
    x = np.zeros((3, 5), np.float32)
    out = np.full(34, -1, np.int64)
    scalar = np.array(2.5)
    assert tramp.invoke(entry, x, out, scalar) == 3
    slots = out[:33].reshape(3, 11)
    assert slots[0, :5].tolist() == [2, 4, ord("f"), 3, 5]
    assert slots[1, :4].tolist() == [1, 8, ord(np.dtype(np.int64).char), 34]
    assert slots[2, :3].tolist() == [0, 8, ord("d")]
    assert out[33] == x.ctypes.data
    with pytest.raises(ValueError, match="not C-contiguous"):
        tramp.invoke(entry, x.T, out)
    with pytest.raises(TypeError):
        tramp.invoke()


_FLAGS_SRC = r"""#include <immintrin.h>
#include "ds_vmath.h"
/* MXCSR's sticky flags after f over x: DE (bit 1) a subnormal operand, UE (bit 4) a subnormal result */
unsigned scalar_flags(int f, const float *x, float *y, int64_t n) {
    _mm_setcsr(_mm_getcsr() & ~0x3fu);
    for (int64_t i = 0; i < n; i++)
        y[i] = f == 0 ? ds_expf(x[i]) : f == 1 ? ds_erff(x[i]) : f == 2 ? ds_tanhf(x[i]) : f == 3 ?
               ds_expf_nonpos(x[i]) : ds_sigmoidf(x[i]);
    return _mm_getcsr() & 0x3fu;
}
unsigned vector_flags(int f, const float *x, float *y, int64_t n) {
    _mm_setcsr(_mm_getcsr() & ~0x3fu);
    for (int64_t i = 0; i + 16 <= n; i += 16)
        ds_st16(y + i, f == 3 ? ds_expf_nonpos16(ds_ld16(x + i)) : f == 5 ? ds_expf_nonpos16_bf16(ds_ld16(x + i))
                                                                          : ds_sigmoid16(ds_ld16(x + i)));
    return _mm_getcsr() & 0x3fu;
}
"""


@pytest.mark.parametrize("isa", ["native", "no-avx512"])
def test_no_subnormal_operations_on_tiny_or_far_arguments(isa: str) -> None:
    """The math forms never compute a subnormal on arguments whose results are normal (MXCSR's DE and UE flags stay
    clear): each such operation takes a microcode assist of ~100 cycles without DAZ, and a softmax of near-equal
    tiny scores (the square of an exp's reduced argument ~1e-19) ran 7x slower. The results there are the polynomials'
    own: exp(tiny) = 1, erf(x) = x * 1.1283791, tanh(x) = x; softmax exps below -87.3 are 0 in both forms, and
    the logistic stays normal or 0 below x = -87.3. Compiled as the libraries are (-fno-trapping-math: selects
    if-convert, so gcc may compute an arm it does not select; a subnormal there counts too)."""
    lib = cc.compile_c(_FLAGS_SRC, "subnormal_flags",
                       flags=[*cc.DEFAULT_FLAGS, *(("-mno-avx512f",) if isa != "native" else ())])
    for fn in (lib.scalar_flags, lib.vector_flags):
        fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], ctypes.c_uint
    tiny = np.float32(10.0) ** np.linspace(-37, -8, 1600, dtype=np.float32)
    tiny = np.concatenate([tiny, -tiny])

    def run(fn, f: int, x: np.ndarray) -> tuple[int, np.ndarray]:
        x = np.ascontiguousarray(x, np.float32)
        y = np.full_like(x, np.nan)
        return fn(f, x.ctypes.data, y.ctypes.data, x.size), y

    for f in (0, 1, 2, 4):
        flags, y = run(lib.scalar_flags, f, tiny)
        assert flags & 0x12 == 0, (f, hex(flags))
        want = {0: np.ones_like(tiny), 1: tiny * np.float32(1.1283791), 2: tiny, 4: None}[f]
        if want is not None:
            assert np.array_equal(y, want), f
    far = np.concatenate([np.linspace(-120, 0, 3200, dtype=np.float32), -np.abs(tiny)])
    for f in (3, 5):
        flags, y = run(lib.vector_flags, f, far)
        assert flags & 0x12 == 0, (f, hex(flags))
        assert (y[far < -87.3] == 0).all() and (y[far >= -87.3] > np.finfo(np.float32).tiny).all()
    flags, y = run(lib.scalar_flags, 3, far)
    assert flags & 0x12 == 0 and np.array_equal(y, run(lib.vector_flags, 3, far)[1])
    wide = np.concatenate([tiny, np.linspace(-200, 200, 3200, dtype=np.float32)])
    for fn in (lib.scalar_flags, lib.vector_flags):
        flags, y = run(fn, 4, wide)
        assert flags & 0x12 == 0, hex(flags)
        # normal or 0 (the scalar form's 0 below x = -87.3, where the exact logistic is below 1.3e-38; the
        # AVX-512 form's 1 / (1 + e^87.3)), never subnormal, and within that of the exact value
        assert ((y == 0) | (y >= np.finfo(np.float32).tiny)).all()
        exact = 1.0 / (1.0 + np.exp(-wide.astype(np.float64)))
        assert (np.abs(y - exact) <= 1e-6 * exact + 1.3e-38).all()
