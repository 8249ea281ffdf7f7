"""Elementwise ONNX ops: numpy references with exact ONNX dtype semantics, and broadcast shape rules.

References compute narrow floats (float16, bfloat16, float8, float4) in float32 and round once at the end, so
results are the correctly rounded value rather than an accumulation of float16 roundings. Shape rules of the
ops that appear in shape arithmetic (Add, Mul, Div, Equal, Where, Cast, ...) also propagate known values
(`TensorType.value`, object arrays of `int | Expr`) so a later Reshape sees `4*seq`, not "unknown".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from dynshape.errors import ShapeError
from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import Layout, Movement, register
from dynshape.ir.types import TensorType
from dynshape.ops import dtypes as dt
from dynshape.sym import ceil_div, eq, is_expr, max_, min_, prove

Fn = Callable[..., Any]


# ----------------------------------------------------------------------------------------------------
# value propagation: elementwise functions over python scalars (int | Expr | float | bool)
# ----------------------------------------------------------------------------------------------------
class _Unknown(Exception):
    """Raised by a value function when the result cannot be stated exactly; the output value becomes None."""


def _prove(cond: Any) -> bool | None:
    """Decide a condition over dims: plain bools directly, symbolic ones through `sym.prove`."""
    if isinstance(cond, (bool, np.bool_)):
        return bool(cond)
    return prove(cond)


class _Quotient:
    """The float value `num / den` of a dim expression `num >= 0` divided by an integer `den >= 2`.

    Why: exporters round sizes through floats (MobileViT's `ceil(H / 2.0) * 2`: Cast to float, Div, Ceil, Mul,
    Cast back); without this, the size is "data-dependent" and everything after it runs uncompiled. A quotient
    is no dim, so it only becomes one again through Ceil, Floor or a Cast to an integer type; any other use
    (arithmetic, comparison) makes the value unknown. Exactness: for `num < 2**p` (p the float type's
    significand bits) the rounded quotient lies strictly between the same integers as the exact one (its
    error, at most `num/den * 2**-p`, is below 1/den, the distance to the nearest integer when den does not
    divide num), so ceil and floor of the float equal ceil_div and floor division. The Div rule assumes
    `num < 2**p` (`InferCtx.assume`): larger inputs run on a build specialised to their shape."""

    __slots__ = ("num", "den")

    def __init__(self, num: Any, den: int):
        self.num, self.den = num, den

    def __eq__(self, other: object) -> bool:
        raise _Unknown  # a comparison of a quotient is not decided here

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"({self.num})/{self.den}"


def _integral(fn: Callable[[Any, int], Any], numeric: Callable[[float], int]) -> Fn:
    """The value function of Ceil / Floor / a Cast to an integer type: dims stay, quotients become dims."""

    def apply(v: Any) -> Any:
        if isinstance(v, _Quotient):
            return fn(v.num, v.den)
        if is_expr(v) or isinstance(v, int):
            return v
        if isinstance(v, float) and math.isfinite(v):
            return numeric(v)
        raise _Unknown

    return apply


_ceil_value = _integral(ceil_div, math.ceil)
_floor_value = _integral(lambda a, b: a // b, math.floor)
_trunc_value = _integral(lambda a, b: a // b, int)  # num >= 0: truncation is floor


def _nonneg(x: Any) -> bool:
    return _prove(x >= 0) is True


def _positive(x: Any) -> bool:
    return _prove(x >= 1) is True


def _scalar(v: Any) -> Any:
    """numpy scalars -> python ones; integral floats -> int, so `2.0 * seq` stays an exact dim expression."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


_FOLD_MAX = 4096  # shape values are short vectors; big constants are left to the engine's folding


def _fold(values: list[np.ndarray], fn: Fn, dtype: np.dtype) -> np.ndarray | None:
    """Apply `fn` elementwise (with numpy broadcasting) to known values; None when any element is unknown.

    Only symbolic values (object arrays of int | Expr) are folded here: all-numeric inputs are folded by the
    engine through the reference. The result is numeric when every element is a plain number.
    """
    if not any(v.dtype == object for v in values) or sum(v.size for v in values) > _FOLD_MAX:
        return None
    arrs = np.broadcast_arrays(*[np.asarray(v, dtype=object) for v in values])
    shape = arrs[0].shape if arrs else ()
    out = []
    try:
        for elems in zip(*[a.ravel() for a in arrs]):
            if any(isinstance(e, (str, bytes)) for e in elems):
                return None  # a string tensor, not a shape value
            out.append(fn(*[_scalar(e) for e in elems]))
    except (_Unknown, ShapeError, TypeError, ZeroDivisionError):
        return None
    if any(is_expr(e) or isinstance(e, _Quotient) for e in out):
        res = np.empty(len(out), dtype=object)
        res[:] = out
        return res.reshape(shape)
    try:
        return dt.cast(np.array(out, dtype=np.float64 if dt.is_float(dtype) else None), dtype).reshape(shape)
    except (TypeError, ValueError, OverflowError):
        return None


def _fits(value: np.ndarray | None, shape: tuple) -> np.ndarray | None:
    """`value` if it has exactly the (static) output shape, else None."""
    return value if value is not None and tuple(value.shape) == tuple(shape) else None


def _trunc_div(a: Any, b: Any) -> Any:
    """ONNX integer Div (truncation). Python's // floors, which agrees only when neither side is negative."""
    if not (is_expr(a) or is_expr(b)):
        if b == 0:
            raise _Unknown
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    if _nonneg(a) and _positive(b):
        return a // b
    raise _Unknown


def _int_mod(a: Any, b: Any) -> Any:
    if _nonneg(a) and _positive(b):
        return a % b
    raise _Unknown


def _int_floor_mod(a: Any, b: Any) -> Any:
    """Mod with fmod=0 takes the divisor's sign (numpy's mod): for a positive divisor the engine's floor mod,
    whatever the dividend's sign (torch's `-h % w` exports as Neg then Mod; fmod=1 truncates, so it keeps
    `_int_mod`'s non-negative dividend)."""
    if _positive(b):
        return a % b
    raise _Unknown


def _min(*xs: Any) -> Any:
    out = xs[0]
    for x in xs[1:]:
        out = min_(out, x)
    return out


def _max(*xs: Any) -> Any:
    out = xs[0]
    for x in xs[1:]:
        out = max_(out, x)
    return out


def _decide(cond: Any) -> bool:
    r = _prove(cond)
    if r is None:
        raise _Unknown
    return r


def _equal(a: Any, b: Any) -> bool:
    if not (is_expr(a) or is_expr(b)):
        return a == b
    return _decide(eq(a, b))


# ----------------------------------------------------------------------------------------------------
# shape rules
# ----------------------------------------------------------------------------------------------------
def _legacy_shape(ctx: InferCtx, a: tuple, b: tuple) -> tuple:
    """Opset < 7 `broadcast=1, axis=k`: B's dims line up with A's starting at axis k."""
    if ctx.opset < 7 and ctx.attr("broadcast", 0) and ctx.attr("axis", None) is not None and len(b):
        axis = ctx.attr("axis", None) % max(len(a), 1)
        return tuple(b) + (1,) * (len(a) - axis - len(b))
    return tuple(b)


def _broadcast_rule(out_dtype: np.dtype | None = None, fold: Fn | None = None,
                    same_dtype: bool = True) -> Callable[[InferCtx], list[TensorType]]:
    """Shape rule of an n-ary broadcasting op; `fold` (python-scalar function) propagates known values."""

    def infer(ctx: InferCtx) -> list[TensorType]:
        ins = [t for t in ctx.inputs if t is not None]
        if same_dtype and len({t.dtype for t in ins}) > 1:
            ctx.error(f"inputs must share one dtype, got {', '.join(str(t.dtype) for t in ins)}",
                      fix="insert a Cast so both operands have the same type")
        shapes = [tuple(t.shape) for t in ins]
        if len(shapes) == 2:
            shapes[1] = _legacy_shape(ctx, shapes[0], shapes[1])
        shape = tuple(ctx.broadcast(*shapes))
        dtype = np.dtype(out_dtype) if out_dtype is not None else ins[0].dtype
        value = None
        vals = [t.value for t in ins]
        if fold is not None and all(v is not None for v in vals):
            if len(vals) == 2 and len(shapes[1]) != np.ndim(vals[1]):
                vals[1] = np.reshape(vals[1], shapes[1])
            value = _fits(_fold(vals, fold, dtype), shape)
        return [TensorType(dtype, shape, value)]

    return infer


def _same_rule(ctx: InferCtx) -> list[TensorType]:
    """Unary ops: output has the input's dtype and shape."""
    x = ctx.inputs[0]
    return [TensorType(x.dtype, x.shape)]


def _neg_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    value = None if x.value is None else _fold([x.value], lambda a: -a, x.dtype)
    return [TensorType(x.dtype, x.shape, value)]


def _identity_rule(ctx: InferCtx) -> list[TensorType]:
    return [ctx.inputs[0]]


def _bool_rule(ctx: InferCtx) -> list[TensorType]:
    return [TensorType(np.dtype(bool), ctx.inputs[0].shape)]


# ----------------------------------------------------------------------------------------------------
# reference helpers
# ----------------------------------------------------------------------------------------------------
def _compute(x: np.ndarray) -> np.ndarray:
    """View of `x` in a dtype numpy computes well in (narrow floats -> float32, int4/int2 -> int64)."""
    if x.dtype.kind == "V" and dt.is_int(x.dtype):
        return x.astype(np.int64)
    return x.astype(dt.compute_dtype(x.dtype), copy=False)


def _legacy_bcast(a: np.ndarray, b: np.ndarray, attrs: dict) -> np.ndarray:
    """Reshape B for opset < 7 `broadcast=1, axis=k` semantics (B aligned to A at axis k)."""
    if attrs.get("_opset", 99) < 7 and attrs.get("broadcast", 0) and "axis" in attrs and b.ndim:
        axis = attrs["axis"] % max(a.ndim, 1)
        return b.reshape(b.shape + (1,) * (a.ndim - axis - b.ndim))
    return b


def _unary(fn: Fn) -> Callable[[list, dict], list]:
    """Reference of unary `fn(x, attrs)`, computed in `_compute` precision, returned in the input dtype."""

    def ref(inputs: list, attrs: dict) -> list:
        x = inputs[0]
        with np.errstate(all="ignore"):
            y = fn(_compute(x), attrs)
        return [np.asarray(y).astype(x.dtype, copy=False)]

    return ref


def _binary(fn: Fn) -> Callable[[list, dict], list]:
    """Reference of a same-typed binary op `fn(a, b)`; the result has A's dtype (integer ops wrap like C)."""

    def ref(inputs: list, attrs: dict) -> list:
        a, b = inputs[0], _legacy_bcast(inputs[0], inputs[1], attrs)
        with np.errstate(all="ignore"):
            y = fn(_compute(a), _compute(b))
        return [np.asarray(y).astype(a.dtype, copy=False)]

    return ref


def _variadic(fn: Fn, mean: bool = False) -> Callable[[list, dict], list]:
    """Reference of Min/Max/Sum/Mean: fold `fn` over all inputs with multidirectional broadcasting."""

    def ref(inputs: list, attrs: dict) -> list:
        xs = [x for x in inputs if x is not None]
        acc = _compute(xs[0])
        with np.errstate(all="ignore"):
            for x in xs[1:]:
                acc = fn(acc, _compute(x))
            if mean:
                acc = acc / len(xs)
        return [np.asarray(acc).astype(xs[0].dtype, copy=False)]

    return ref


def _compare(fn: Fn) -> Callable[[list, dict], list]:
    def ref(inputs: list, attrs: dict) -> list:
        a, b = inputs[0], _legacy_bcast(inputs[0], inputs[1], attrs)
        if a.dtype == dt.STRING or b.dtype == dt.STRING:
            return [np.asarray(fn(a, b), dtype=bool)]
        return [np.asarray(fn(_compute(a), _compute(b)), dtype=bool)]

    return ref


def _trunc_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C-style integer division (ONNX Div on integers truncates toward zero; numpy floors)."""
    if a.dtype.kind == "f":
        return a / b
    safe = np.where(b == 0, 1, b).astype(b.dtype)
    q = a // safe
    if a.dtype.kind == "i":
        q = q + ((a % safe != 0) & ((a < 0) != (safe < 0))).astype(q.dtype)
    return np.where(b == 0, 0, q)


_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """Exact erf (math.erf elementwise, in float64); numpy has none and scipy is not a dependency."""
    return _erf(np.asarray(x, dtype=np.float64)).astype(np.float64)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """Overflow-free logistic: exp of a non-positive number only."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.zeros((), x.dtype), x)


def _pow(inputs: list, attrs: dict) -> list:
    """Pow: result has X's type, Y may be any numeric type; integer powers stay exact (wrapping)."""
    x, y = inputs[0], _legacy_bcast(inputs[0], inputs[1], attrs)
    xc, yc = _compute(x), _compute(y)
    with np.errstate(all="ignore"):
        if dt.is_int(x.dtype) and dt.is_int(y.dtype) and np.all(yc >= 0):
            z = np.power(xc.astype(np.int64), yc.astype(np.int64))
        else:
            z = np.power(xc.astype(np.float64), yc.astype(np.float64))
    return [np.asarray(z).astype(x.dtype)]


def _mod(inputs: list, attrs: dict) -> list:
    """Mod: fmod=0 takes the divisor's sign (np.mod), fmod=1 the dividend's (C fmod); int x mod 0 is 0."""
    a, b = inputs[0], _legacy_bcast(inputs[0], inputs[1], attrs)
    ac, bc = _compute(a), _compute(b)
    with np.errstate(all="ignore"):
        if dt.is_int(a.dtype):
            safe = np.where(bc == 0, 1, bc).astype(bc.dtype)
            r = np.fmod(ac, safe) if attrs.get("fmod", 0) else np.mod(ac, safe)
            r = np.where(bc == 0, 0, r)
        else:
            r = np.fmod(ac, bc) if attrs.get("fmod", 0) else np.mod(ac, bc)
    return [np.asarray(r).astype(a.dtype)]


def _bitshift(inputs: list, attrs: dict) -> list:
    """BitShift: shifts >= bit width (or negative) give 0, or the sign fill for arithmetic right shifts."""
    a, b = np.broadcast_arrays(inputs[0], inputs[1])
    bits = np.iinfo(a.dtype).bits
    ok = (b >= 0) & (b < bits)
    s = np.where(ok, b, 0).astype(a.dtype)
    if attrs.get("direction") == "LEFT":
        unsigned = np.dtype(f"u{a.dtype.itemsize}")
        y = np.left_shift(a.view(unsigned) if a.dtype.kind == "i" else a,
                          s.astype(unsigned)).view(a.dtype)
        y = np.where(ok, y, 0)
    else:
        y = np.right_shift(a, s)
        y = np.where(ok, y, np.where(a < 0, -1, 0) if a.dtype.kind == "i" else 0)
    return [np.asarray(y).astype(a.dtype)]


def _clip(inputs: list, attrs: dict) -> list:
    """Clip: bounds are attributes before opset 11, optional inputs after; min > max yields max everywhere."""
    x = inputs[0]
    if attrs.get("_opset", 99) < 11:
        lo, hi = attrs.get("min"), attrs.get("max")
    else:
        lo = inputs[1] if len(inputs) > 1 else None
        hi = inputs[2] if len(inputs) > 2 else None
    y = _compute(x)
    if lo is not None:
        y = np.maximum(y, np.asarray(lo).astype(y.dtype))
    if hi is not None:
        y = np.minimum(y, np.asarray(hi).astype(y.dtype))
    return [np.asarray(y).astype(x.dtype)]


def _clip_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    return [TensorType(x.dtype, x.shape)]


def _prelu(inputs: list, attrs: dict) -> list:
    """PRelu; before opset 7 a 1-D slope is per channel (axis 1), not numpy-aligned to the last axis."""
    x, slope = inputs
    if attrs.get("_opset", 99) < 7 and slope.ndim == 1 and slope.size > 1 and x.ndim > 2:
        slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
    xc, sc = _compute(x), _compute(slope)
    return [np.where(xc < 0, xc * sc, xc).astype(x.dtype)]


def _prelu_rule(ctx: InferCtx) -> list[TensorType]:
    """PRelu broadcasts the slope unidirectionally to X: the output always has X's shape."""
    x, slope = ctx.inputs
    s_shape = tuple(slope.shape)
    if ctx.opset < 7 and len(s_shape) == 1 and len(x.shape) > 2:
        s_shape = s_shape + (1,) * (len(x.shape) - 2)
    ctx.broadcast(tuple(x.shape), s_shape)
    return [TensorType(x.dtype, x.shape)]


def _gelu(x: np.ndarray, attrs: dict) -> np.ndarray:
    x = x.astype(np.float64)
    if attrs.get("approximate", "none") == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def _shrink(x: np.ndarray, attrs: dict) -> np.ndarray:
    lambd, bias = attrs.get("lambd", 0.5), attrs.get("bias", 0.0)
    x = x.astype(np.float64) if x.dtype.kind in "iu" else x
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))


def _where(inputs: list, attrs: dict) -> list:
    c, x, y = inputs
    return [np.where(c, x, y).astype(x.dtype, copy=False)]


def _where_rule(ctx: InferCtx) -> list[TensorType]:
    """Where: broadcast of all three; the value is known when the picked branch's elements are."""
    c, x, y = ctx.inputs
    if x.dtype != y.dtype:
        ctx.error(f"X and Y must share one dtype, got {x.dtype} and {y.dtype}", fix="Cast one branch")
    shape = tuple(ctx.broadcast(tuple(c.shape), tuple(x.shape), tuple(y.shape)))
    value = None
    if c.value is not None:
        picks = np.asarray(c.value).astype(bool)
        hole = np.zeros((), dtype=object)  # stands for an unknown branch that is never picked
        if x.value is not None and y.value is not None:
            value = _fold([c.value, x.value, y.value], lambda p, a, b: a if p else b, x.dtype)
        elif x.value is not None and picks.all():
            value = _fold([c.value, x.value, hole], lambda p, a, b: a, x.dtype)
        elif y.value is not None and not picks.any():
            value = _fold([c.value, hole, y.value], lambda p, a, b: b, x.dtype)
        value = _fits(value, shape)
    return [TensorType(x.dtype, shape, value)]


# ----------------------------------------------------------------------------------------------------
# Cast / CastLike / Identity / Dropout
# ----------------------------------------------------------------------------------------------------
def _cast(inputs: list, attrs: dict) -> list:
    return [dt.cast(inputs[0], dt.np_dtype(attrs["to"]), bool(attrs.get("saturate", 1)),
                    attrs.get("round_mode", "up"))]


def _cast_like(inputs: list, attrs: dict) -> list:
    saturate, round_mode = bool(attrs.get("saturate", 1)), attrs.get("round_mode", "up")
    return [dt.cast(inputs[0], inputs[1].dtype, saturate, round_mode)]


def _cast_value(value: np.ndarray | None, dtype: np.dtype) -> np.ndarray | None:
    """Cast of a shape value: dims survive casts between integer/float types (they are small integers)."""
    if value is None or not (dt.is_int(dtype) or dt.is_float(dtype)):
        return None

    def conv(v: Any) -> Any:
        if isinstance(v, _Quotient):  # only an integer type makes it a dim again
            if dt.is_int(dtype):
                return _trunc_value(v)
            raise _Unknown
        if isinstance(v, float):  # a non-integral float element: truncate like the numeric cast
            return float(v) if dt.is_float(dtype) else int(v)
        return v

    return _fold([value], conv, dtype)


def _assume_exact_in_float(ctx: InferCtx, value: np.ndarray | None, dtype: np.dtype, below: bool) -> None:
    """A dim expression held in a float type is exact only up to 2**p (p its significand bits; strictly below
    for a quotient): assume it, so larger inputs run on a build specialised to their shape."""
    if value is None or value.dtype != object or not dt.is_float(dtype):
        return
    top = dt.exact_int_limit(dtype) - (1 if below else 0)
    for v in value.reshape(-1):
        e = v.num if isinstance(v, _Quotient) else v
        if is_expr(e):
            ctx.assume(e <= top, f"the size {e} is exact in {dtype} (at most {top})")


def _cast_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    dtype = dt.np_dtype(ctx.attr("to", None))
    value = _cast_value(x.value, dtype)
    _assume_exact_in_float(ctx, value, dtype, below=False)
    return [TensorType(dtype, x.shape, value)]


def _cast_like_rule(ctx: InferCtx) -> list[TensorType]:
    x, like = ctx.inputs
    value = _cast_value(x.value, like.dtype)
    _assume_exact_in_float(ctx, value, like.dtype, below=False)
    return [TensorType(like.dtype, x.shape, value)]


def _rounding_rule(fn: Fn) -> Callable[[InferCtx], list[TensorType]]:
    """Ceil / Floor: the value of a dim or a quotient of dims is a dim (see `_Quotient`)."""

    def infer(ctx: InferCtx) -> list[TensorType]:
        x = ctx.inputs[0]
        value = None if x.value is None else _fits(_fold([x.value], fn, x.dtype), x.shape)
        return [TensorType(x.dtype, x.shape, value)]

    return infer


def _bit_width(dtype: np.dtype) -> int:
    if dtype.kind == "V":
        return (ml_dtypes.finfo(dtype) if dt.is_float(dtype) else ml_dtypes.iinfo(dtype)).bits
    return dtype.itemsize * 8


def _bitcast(inputs: list, attrs: dict) -> list:
    """BitCast reinterprets the (little-endian) bits; both types must have the same width."""
    x, dtype = inputs[0], dt.np_dtype(attrs["to"])
    if dt.STRING in (x.dtype, dtype) or _bit_width(x.dtype) != _bit_width(dtype):
        raise ValueError(f"BitCast from {x.dtype} to {dtype}: the types must be non-string and equally wide")
    return [np.asarray(x, order="C").view(dtype)]  # (ascontiguousarray would make 0-d 1-d)


def _bitcast_rule(ctx: InferCtx) -> list[TensorType]:
    x, dtype = ctx.inputs[0], dt.np_dtype(ctx.attr("to", None))
    if dt.STRING in (x.dtype, dtype) or _bit_width(x.dtype) != _bit_width(dtype):
        ctx.error(f"cannot reinterpret {x.dtype} as {dtype}: the types must be non-string and equally wide")
    return [TensorType(dtype, x.shape)]


def _swiglu(inputs: list, attrs: dict) -> list:
    """SwiGLU: Swish_alpha(A) * B, with A and B of one shape (no broadcasting)."""
    a, b = inputs
    ac = _compute(a)
    return [(ac * _sigmoid(attrs.get("alpha", 1.0) * ac) * _compute(b)).astype(a.dtype)]


def _swiglu_rule(ctx: InferCtx) -> list[TensorType]:
    a, b = ctx.inputs
    if a.dtype != b.dtype or len(a.shape) != len(b.shape):
        ctx.error(f"A and B must have one dtype and one shape (no broadcasting), got {a.dtype}{list(a.shape)} "
                  f"and {b.dtype}{list(b.shape)}")
    return [TensorType(a.dtype, tuple(ctx.unify(p, q) for p, q in zip(a.shape, b.shape)))]


def _identity(inputs: list, attrs: dict) -> list:
    return [inputs[0]]


def _dropout(inputs: list, attrs: dict) -> list:
    """Dropout is the identity in inference; training mode (opset >= 12 input 2) drops at random."""
    x = inputs[0]
    opset = attrs.get("_opset", 99)
    if opset >= 12:
        ratio = float(np.ravel(inputs[1])[0]) if len(inputs) > 1 and inputs[1] is not None else 0.5
        training = bool(np.ravel(inputs[2])[0]) if len(inputs) > 2 and inputs[2] is not None else False
    else:
        ratio, training = attrs.get("ratio", 0.5), False
    if not training or ratio == 0:
        return [x.copy(), np.ones(x.shape, dtype=bool if opset >= 10 else x.dtype)]
    from dynshape.ops.random import generator

    keep = np.asarray(generator(attrs).uniform(0.0, 1.0, size=x.shape)) >= ratio  # seeded: reproducible
    return [(x * keep / (1 - ratio)).astype(x.dtype), keep]


def _dropout_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    mask = np.dtype(bool) if ctx.opset >= 10 else x.dtype
    return [TensorType(x.dtype, x.shape), TensorType(mask, x.shape)]


# ----------------------------------------------------------------------------------------------------
# registrations
# ----------------------------------------------------------------------------------------------------
_UNARY: dict[str, Fn] = {
    "Sqrt": lambda x, a: np.sqrt(x),
    "Reciprocal": lambda x, a: 1 / x,
    "Exp": lambda x, a: np.exp(x),
    "Log": lambda x, a: np.log(x),
    "Erf": lambda x, a: erf(x),
    "Tanh": lambda x, a: np.tanh(x),
    "Sigmoid": lambda x, a: _sigmoid(x),
    "Relu": lambda x, a: np.maximum(x, np.zeros((), x.dtype)),
    "LeakyRelu": lambda x, a: np.where(x < 0, a.get("alpha", 0.01) * x, x),
    "Elu": lambda x, a: np.where(x > 0, x, a.get("alpha", 1.0) * np.expm1(x)),
    "Celu": lambda x, a: np.where(x > 0, x, a.get("alpha", 1.0) * np.expm1(x / a.get("alpha", 1.0))),
    "Selu": lambda x, a: a.get("gamma", 1.05070102214813232421875)
    * np.where(x > 0, x, a.get("alpha", 1.67326319217681884765625) * np.expm1(x)),
    "Softplus": lambda x, a: _softplus(x),
    "Softsign": lambda x, a: x / (1 + np.abs(x)),
    "HardSigmoid": lambda x, a: np.clip(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0, 1),
    "HardSwish": lambda x, a: x * np.clip(x / 6 + 0.5, 0, 1),
    "ThresholdedRelu": lambda x, a: np.where(x > a.get("alpha", 1.0), x, 0),
    "Mish": lambda x, a: x * np.tanh(_softplus(x)),
    "Swish": lambda x, a: x * _sigmoid(a.get("alpha", 1.0) * x),
    "Gelu": _gelu,
    "Shrink": _shrink,
    "Abs": lambda x, a: np.abs(x),
    "Floor": lambda x, a: np.floor(x),
    "Ceil": lambda x, a: np.ceil(x),
    "Round": lambda x, a: np.round(x),  # half to even, as ONNX specifies
    "Sign": lambda x, a: np.sign(x),
    "Sin": lambda x, a: np.sin(x),
    "Cos": lambda x, a: np.cos(x),
    "Tan": lambda x, a: np.tan(x),
    "Asin": lambda x, a: np.arcsin(x),
    "Acos": lambda x, a: np.arccos(x),
    "Atan": lambda x, a: np.arctan(x),
    "Sinh": lambda x, a: np.sinh(x),
    "Cosh": lambda x, a: np.cosh(x),
    "Asinh": lambda x, a: np.arcsinh(x),
    "Acosh": lambda x, a: np.arccosh(x),
    "Atanh": lambda x, a: np.arctanh(x),
    "BitwiseNot": lambda x, a: np.invert(x),
}
# Elementwise ops the channels-last layout does not move Transposes through (it converts back before them): the
# ones its hand-kept list of names left out before the op table carried the property. Each would be exact to
# sink; leaving one here costs speed on a channels-last graph, never a wrong value.
_LAYOUT_KEEPS_ORDER = frozenset({"Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh",
                                 "Atanh", "BitwiseNot", "Mod", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
                                 "CastLike"})


def _elementwise(name: str, reference: Callable[[list, dict], list], infer: Callable[[InferCtx], list],
                 **props: Any) -> None:
    """Register an elementwise op: under the channels-last layout it computes the same values on permuted
    operands, so a new one is sunk through by default (unless listed in `_LAYOUT_KEEPS_ORDER`)."""
    layout = Layout.CHANNELS_FIRST if name in _LAYOUT_KEEPS_ORDER else Layout.ELEMENTWISE
    register(name, reference=reference, infer=infer, elementwise=True, layout=layout, **props)


_ROUNDING_RULES = {"Ceil": _rounding_rule(_ceil_value), "Floor": _rounding_rule(_floor_value)}
for _name, _fn in _UNARY.items():
    _elementwise(_name, reference=_unary(_fn), infer=_ROUNDING_RULES.get(_name, _same_rule))

_elementwise("Neg", reference=_unary(lambda x, a: -x), infer=_neg_rule)
_elementwise("Not", reference=lambda i, a: [np.logical_not(i[0])], infer=_same_rule)
_elementwise("IsNaN", reference=lambda i, a: [np.isnan(_compute(i[0]))], infer=_bool_rule)
_elementwise("IsInf", reference=lambda i, a: [
    (np.isposinf(_compute(i[0])) & bool(a.get("detect_positive", 1)))
    | (np.isneginf(_compute(i[0])) & bool(a.get("detect_negative", 1)))], infer=_bool_rule)

_elementwise("Add", reference=_binary(np.add), infer=_broadcast_rule(fold=lambda a, b: a + b),
             arithmetic=True)
_elementwise("Sub", reference=_binary(np.subtract), infer=_broadcast_rule(fold=lambda a, b: a - b),
             arithmetic=True)
_elementwise("Mul", reference=_binary(np.multiply), infer=_broadcast_rule(fold=lambda a, b: a * b),
             arithmetic=True)


def _float_div(a: Any, b: Any) -> Any:
    """Float Div of dims: a dim over a positive integer is a `_Quotient` (exact only through Ceil / Floor /
    a Cast to an integer type); plain numbers divide as floats."""
    if isinstance(a, _Quotient) or isinstance(b, _Quotient) or is_expr(b):
        raise _Unknown
    if not is_expr(a):
        if b == 0:
            raise _Unknown
        return a / b
    if not (isinstance(b, int) and b >= 1 and _nonneg(a)):
        raise _Unknown
    return a if b == 1 else _Quotient(a, b)


def _div_rule(ctx: InferCtx) -> list[TensorType]:
    """Div folds integers where truncation toward zero is provably floor division, and floats into
    quotients of dims (see `_Quotient`, whose exactness bound it assumes)."""
    if dt.is_int(ctx.inputs[0].dtype):
        return _broadcast_rule(fold=_trunc_div)(ctx)
    if not dt.is_float(ctx.inputs[0].dtype):
        return _broadcast_rule()(ctx)
    out = _broadcast_rule(fold=_float_div)(ctx)
    _assume_exact_in_float(ctx, out[0].value, out[0].dtype, below=True)
    return out


def _mod_rule(ctx: InferCtx) -> list[TensorType]:
    fold = (_int_mod if ctx.attr("fmod", 0) else _int_floor_mod) if dt.is_int(ctx.inputs[0].dtype) else None
    return _broadcast_rule(fold=fold)(ctx)


_elementwise("Div", reference=_binary(_trunc_divide), infer=_div_rule, arithmetic=True)
_elementwise("Mod", reference=_mod, infer=_mod_rule)
_elementwise("Pow", reference=_pow, infer=_broadcast_rule(same_dtype=False))
_elementwise("PRelu", reference=_prelu, infer=_prelu_rule)
_elementwise("BitShift", reference=_bitshift, infer=_broadcast_rule())
_elementwise("BitwiseAnd", reference=_binary(np.bitwise_and), infer=_broadcast_rule())
_elementwise("BitwiseOr", reference=_binary(np.bitwise_or), infer=_broadcast_rule())
_elementwise("BitwiseXor", reference=_binary(np.bitwise_xor), infer=_broadcast_rule())

_elementwise("Min", reference=_variadic(np.minimum), infer=_broadcast_rule(fold=_min))
_elementwise("Max", reference=_variadic(np.maximum), infer=_broadcast_rule(fold=_max))
_elementwise("Sum", reference=_variadic(np.add), infer=_broadcast_rule(fold=lambda *xs: sum(xs[1:], xs[0])))
_elementwise("Mean", reference=_variadic(np.add, mean=True), infer=_broadcast_rule())

_BOOL = np.dtype(bool)
_elementwise("Equal", reference=_compare(lambda a, b: a == b), infer=_broadcast_rule(_BOOL, fold=_equal))
_elementwise("Less", reference=_compare(np.less),
             infer=_broadcast_rule(_BOOL, fold=lambda a, b: _decide(a < b)))
_elementwise("LessOrEqual", reference=_compare(np.less_equal),
             infer=_broadcast_rule(_BOOL, fold=lambda a, b: _decide(a <= b)))
_elementwise("Greater", reference=_compare(np.greater),
             infer=_broadcast_rule(_BOOL, fold=lambda a, b: _decide(a > b)))
_elementwise("GreaterOrEqual", reference=_compare(np.greater_equal),
             infer=_broadcast_rule(_BOOL, fold=lambda a, b: _decide(a >= b)))
_elementwise("And", reference=_compare(np.logical_and), infer=_broadcast_rule(_BOOL))
_elementwise("Or", reference=_compare(np.logical_or), infer=_broadcast_rule(_BOOL))
_elementwise("Xor", reference=_compare(np.logical_xor), infer=_broadcast_rule(_BOOL))

_elementwise("Where", reference=_where, infer=_where_rule)
_elementwise("Clip", reference=_clip, infer=_clip_rule, permuted_inputs=1)  # min, max: parameters
_elementwise("Cast", reference=_cast, infer=_cast_rule)
_elementwise("CastLike", reference=_cast_like, infer=_cast_like_rule)
_elementwise("Identity", reference=_identity, infer=_identity_rule, movement=Movement.VIEW)
register("BitCast", reference=_bitcast, infer=_bitcast_rule)
register("SwiGLU", reference=_swiglu, infer=_swiglu_rule)
_elementwise("Dropout", reference=_dropout, infer=_dropout_rule, random=True)  # training mode draws
