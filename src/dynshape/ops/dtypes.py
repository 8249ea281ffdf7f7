"""Dtype helpers shared by the op families: ONNX type codes, ml_dtypes families, and exact Cast semantics.

numpy alone cannot express ONNX's dtype zoo (bfloat16, float8, float4, int4/int2): ml_dtypes supplies them as
numpy dtypes of kind 'V', so `np.issubdtype` misclassifies them. Everything here classifies by
`finfo`/`iinfo`.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper

STRING = np.dtype(object)


@functools.cache
def np_dtype(elem_type: int) -> np.dtype:
    """numpy dtype of an ONNX `TensorProto.DataType` code (strings are object arrays)."""
    if elem_type == TensorProto.STRING:
        return STRING
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


@functools.cache
def is_float(dtype: np.dtype) -> bool:
    """True for every floating type, ml_dtypes' included."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return True
    if dtype.kind != "V":
        return False
    try:
        ml_dtypes.finfo(dtype)
    except ValueError:
        return False
    return True


@functools.cache
def is_int(dtype: np.dtype) -> bool:
    """True for every integer type (int2/int4/uint2/uint4 included), False for bool."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return True
    if dtype.kind != "V":
        return False
    try:
        ml_dtypes.iinfo(dtype)
    except ValueError:
        return False
    return True


def exact_int_limit(dtype: np.dtype) -> int:
    """2**p for a float type of p significand bits: every integer of magnitude up to it is exact in the type
    (sizes held in floats: ops/elementwise's quotients, a float Range over a size)."""
    return 2 ** (int(ml_dtypes.finfo(dtype).nmant) + 1)


def is_low_float(dtype: np.dtype) -> bool:
    """ml_dtypes floats (bfloat16, float8, float4, ...): numpy has few kernels for them."""
    return np.dtype(dtype).kind == "V" and is_float(dtype)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """Dtype to do float math in: float16 and ml_dtypes floats go through float32 to keep rounding sane."""
    dtype = np.dtype(dtype)
    if is_low_float(dtype) or dtype == np.float16:
        return np.dtype(np.float32)
    return dtype


_FLOAT8 = {np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
                                 ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz)}
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)


def cast(x: np.ndarray, dtype: np.dtype, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """ONNX Cast: `saturate` clamps out-of-range values into float8 types (instead of NaN/Inf); strings are
    parsed/printed; e8m0 rounds the exponent by `round_mode`; everything else is numpy/ml_dtypes `astype`."""
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    if dtype == STRING:
        return _to_string(x)
    if x.dtype == STRING:
        return _from_string(x, dtype)
    if dtype in _FLOAT8 and saturate and is_float(x.dtype):
        info = ml_dtypes.finfo(dtype)
        x32 = x.astype(np.float32)
        return np.where(np.isnan(x32), x32, np.clip(x32, float(info.min), float(info.max))).astype(dtype)
    if dtype == _E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if is_low_float(x.dtype) and dtype.kind in "iub":
        x = x.astype(np.float32)  # ml_dtypes floats have no direct path to every integer type
    return x.astype(dtype)


def _to_string(x: np.ndarray) -> np.ndarray:
    if is_float(x.dtype):
        x = x.astype(np.float32) if is_low_float(x.dtype) else x
        flat = [_float_str(float(v), x.dtype) for v in x.ravel()]
    elif x.dtype == np.bool_:
        flat = ["1" if v else "0" for v in x.ravel()]
    else:
        flat = [str(v) for v in x.ravel()]
    out = np.empty(x.shape, dtype=object)
    out.ravel()[:] = flat if x.size else []
    return out


def _float_str(v: float, dtype: np.dtype) -> str:
    """Shortest round-trip text of `v` in its own precision; ONNX spells the specials NaN / INF / -INF."""
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "INF" if v > 0 else "-INF"
    return str(dtype.type(v))


def _parse_int(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        return int(float(s))


def _from_string(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    texts = [s.decode() if isinstance(s, bytes) else str(s) for s in x.ravel()]
    if dtype == np.bool_:
        vals = np.array([s.strip().lower() not in ("0", "false", "") for s in texts], dtype=bool)
    elif is_int(dtype):
        vals = np.array([_parse_int(s) for s in texts], dtype=np.int64)
    else:
        vals = np.array([float(s) for s in texts], dtype=np.float64)
    return cast(vals.reshape(x.shape), dtype)


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float -> float8_e8m0fnu (a pure power of two, bias 127, 0xFF = NaN), rounding the float32 mantissa."""
    f = np.asarray(x, dtype=np.float32).view(np.uint32)
    exp = ((f >> 23) & 0xFF).astype(np.int32)
    mant = f & 0x7FFFFF
    special = exp == 0xFF
    if round_mode == "up":
        bump = mant != 0
    elif round_mode == "nearest":  # round half up for normals; subnormals need more than half
        bump = ((mant & 0x400000) != 0) & (((mant & 0x3FFFFF) != 0) | (exp > 0))
    elif round_mode == "down":
        bump = np.zeros(exp.shape, dtype=bool)
    else:
        raise ValueError(f"Cast: unknown round_mode {round_mode!r}")
    e = exp + bump
    e = np.minimum(e, 0xFE) if saturate else np.where(e > 0xFE, 0xFF, e)
    e = np.where(special, 0xFF, e)
    return e.astype(np.uint8).view(_E8M0)
