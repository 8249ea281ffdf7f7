"""Tricky ONNX semantics of the elementwise references, each checked against an independent oracle."""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto

import dynshape.ops.elementwise  # noqa: F401  (registers the ops)
from dynshape.ir.opdef import lookup as get
from dynshape.ops.dtypes import np_dtype


def ref(op: str, *inputs, **attrs):
    attrs.setdefault("_opset", 21)
    return get(op).reference(list(inputs), attrs)


ints = st.integers(-(2**31), 2**31 - 1)


@given(ints, ints.filter(lambda b: b != 0))
def test_integer_div_truncates_toward_zero(a: int, b: int) -> None:
    (q,) = ref("Div", np.array([a], np.int64), np.array([b], np.int64))
    assert q.dtype == np.int64
    assert q[0] == (abs(a) // abs(b)) * (1 if (a >= 0) == (b >= 0) else -1)


@given(st.integers(-128, 127), st.integers(-128, 127).filter(lambda b: b != 0))
def test_mod_sign_follows_divisor_or_dividend(a: int, b: int) -> None:
    x, y = np.array([a], np.int8), np.array([b], np.int8)
    assert ref("Mod", x, y)[0][0] == a % b  # python's % takes the divisor's sign, like fmod=0
    assert ref("Mod", x, y, fmod=1)[0][0] == int(math.fmod(a, b))
    assert ref("Mod", x, y)[0].dtype == np.int8


def test_float_mod_fmod0_takes_divisor_sign() -> None:
    a = np.array([-4.3, 7.2, 5.0, -5.0], np.float32)
    b = np.array([2.1, -3.4, 3.0, 3.0], np.float32)
    expected = [math.fmod(x, y) + (y if math.fmod(x, y) and (math.fmod(x, y) < 0) != (y < 0) else 0)
                for x, y in zip(a.astype(float), b.astype(float))]
    np.testing.assert_allclose(ref("Mod", a, b)[0], expected, rtol=1e-6)


def test_float16_add_rounds_once() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1000).astype(np.float16)
    b = rng.standard_normal(1000).astype(np.float16)
    (out,) = ref("Add", a, b)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, (a.astype(np.float64) + b.astype(np.float64)).astype(np.float16))


def test_pow_integer_is_exact_and_keeps_base_type() -> None:
    (out,) = ref("Pow", np.array([3, -2], np.int64), np.array([39, 61], np.int64))
    assert out.tolist() == [3**39, (-2) ** 61]
    (mixed,) = ref("Pow", np.array([2, 3], np.int32), np.array([0.5, 2.0], np.float32))
    assert mixed.dtype == np.int32 and mixed.tolist() == [int(2**0.5), 9]


def test_round_is_half_to_even() -> None:
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.6], np.float32)
    assert ref("Round", x)[0].tolist() == [float(round(v)) for v in x.tolist()]


def test_bitshift_out_of_range_shifts() -> None:
    x = np.array([-8, 8, 1, -1], np.int32)
    s = np.array([40, 40, -1, 3], np.int32)
    right = ref("BitShift", x, s, direction="RIGHT")[0]
    assert right.tolist() == [-1, 0, 0, -1]  # shifting everything out leaves the sign fill
    left = ref("BitShift", x, s, direction="LEFT")[0]
    assert left.tolist() == [0, 0, 0, -8]


def test_clip_min_above_max_gives_max_and_missing_bounds_are_open() -> None:
    x = np.array([-5, 0, 5], np.int8)
    assert ref("Clip", x, np.array(3, np.int8), np.array(1, np.int8))[0].tolist() == [1, 1, 1]
    assert ref("Clip", x, None, np.array(2, np.int8))[0].tolist() == [-5, 0, 2]
    assert ref("Clip", x.astype(np.float32), min=-1.0, _opset=6)[0].tolist() == [-1, 0, 5]


@pytest.mark.parametrize("to", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
                                TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ])
def test_cast_float8_saturate(to: int) -> None:
    dtype = np_dtype(to)
    big = float(ml_dtypes.finfo(dtype).max)
    x = np.array([1e6, -1e6, np.inf, 0.5], np.float32)
    (sat,) = ref("Cast", x, to=to)
    assert sat.dtype == dtype
    assert sat.astype(np.float32).tolist()[:2] == [big, -big]
    (raw,) = ref("Cast", x, to=to, saturate=0)
    assert not np.isfinite(raw.astype(np.float32)[:3]).any()  # overflow is NaN or Inf without saturation
    assert raw.astype(np.float32)[3] == 0.5


def test_cast_e8m0_round_modes() -> None:
    x = np.array([3.0, 2.0, 5.0, 0.75], np.float32)
    to = TensorProto.FLOAT8E8M0

    def pow2(mode: str) -> list[float]:
        return ref("Cast", x, to=to, round_mode=mode)[0].astype(np.float32).tolist()

    assert pow2("up") == [2.0 ** math.ceil(math.log2(v)) for v in x]
    assert pow2("down") == [2.0 ** math.floor(math.log2(v)) for v in x]
    assert pow2("nearest") == [4.0, 2.0, 4.0, 1.0]  # mantissa >= 1.5 rounds up


def test_cast_int4_keeps_its_range_and_strings_round_trip() -> None:
    # a float outside int4's range is undefined by the spec; ONNX's node suite expects what its reference (over
    # ml_dtypes) gives, which changed with ml_dtypes 0.7 (wrap -> 0): only the range is checked here
    (q,) = ref("Cast", np.arange(-8, 8, dtype=np.float32), to=TensorProto.INT4)
    assert q.astype(np.int32).tolist() == list(range(-8, 8))
    (q,) = ref("Cast", np.arange(-9, 10, dtype=np.int32), to=TensorProto.INT4)  # integers wrap
    assert q.astype(np.int32).tolist() == [((v + 8) % 16) - 8 for v in range(-9, 10)]
    x = np.array([1.5, -0.25, np.nan, np.inf], np.float32)
    (s,) = ref("Cast", x, to=TensorProto.STRING)
    assert s.dtype == object and s[0] == "1.5"
    (back,) = ref("Cast", s, to=TensorProto.FLOAT)
    np.testing.assert_array_equal(back, x)


def test_castlike_takes_dtype_of_second_input() -> None:
    (y,) = ref("CastLike", np.array([1.7, -1.7], np.float32), np.zeros(0, ml_dtypes.bfloat16))
    assert y.dtype == ml_dtypes.bfloat16


def test_dropout_inference_is_identity_with_true_mask() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y, mask = ref("Dropout", x, np.array(0.7, np.float32), _opset=13)
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == bool and mask.all()


def test_equal_on_strings_and_where_picks() -> None:
    a = np.array(["x", "y"], dtype=object)
    assert ref("Equal", a, np.array(["x"], dtype=object))[0].tolist() == [True, False]
    (w,) = ref("Where", np.array([True, False]), a, np.array(["z", "z"], dtype=object))
    assert w.tolist() == ["x", "z"]


def test_gelu_tanh_and_exact_agree_with_math() -> None:
    x = np.linspace(-4, 4, 17).astype(np.float32)
    exact = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(float)]
    np.testing.assert_allclose(ref("Gelu", x)[0], exact, rtol=1e-6, atol=1e-7)
    approx = ref("Gelu", x, approximate="tanh")[0]
    np.testing.assert_allclose(approx, exact, atol=1e-3)


def test_sigmoid_keeps_tiny_tails() -> None:
    """exp(100) overflows float32, so 1 / (1 + exp(-x)) would flush sigmoid(-100) to 0."""
    y = ref("Sigmoid", np.array([-100.0, 100.0], np.float32))[0]
    np.testing.assert_allclose(y, [1 / (1 + math.exp(100)), 1.0], rtol=0.1)  # a subnormal: coarse
    assert y[0] > 0


def test_bitcast_reinterprets_bits_and_rejects_width_change() -> None:
    x = np.array([1.0, -2.5], np.float32)
    (y,) = ref("BitCast", x, to=TensorProto.INT32)
    assert y.tolist() == [int.from_bytes(struct.pack("<f", v), "little", signed=True) for v in x.tolist()]
    assert ref("BitCast", np.array(1.0, np.float32), to=TensorProto.UINT32)[0].shape == ()
    with pytest.raises(ValueError, match="wide"):
        ref("BitCast", x, to=TensorProto.INT64)


def test_swiglu_is_swish_gate_times_value() -> None:
    a = np.linspace(-3, 3, 7).astype(np.float32)
    b = np.arange(7, dtype=np.float32)
    (y,) = ref("SwiGLU", a, b, alpha=1.5)
    expect = [p * q / (1 + math.exp(-1.5 * p)) for p, q in zip(a.tolist(), b.tolist())]
    np.testing.assert_allclose(y, expect, rtol=1e-6, atol=1e-7)
