"""Elementwise arithmetic, comparisons, activations, reductions, softmax and products.

Lowerings follow torch.onnx's exporter where the compiler's fusions know its patterns: GELU as
x * (0.5 * (erf(x / sqrt 2) + 1)), a linear layer as MatMul by the transposed constant weight plus the bias
(on the un-flattened input, so the bias, activation and residual add join the product's epilogue), batched
products on the 4-D operands the flattening views came from (so attention is MatMul -> Softmax -> MatMul).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dynshape.frontends.aten.common import (
    axis,
    cast,
    promoted,
    reshape,
    root,
    static_int,
    tensor_of,
)
from dynshape.frontends.aten.convert import handles
from dynshape.frontends.aten.emit import Tensor
from dynshape.frontends.aten.symbols import Unsupported

# ---- elementwise -----------------------------------------------------------------------------------------
_UNARY = {
    "neg": "Neg", "abs": "Abs", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "sin": "Sin", "cos": "Cos",
    "tan": "Tan", "tanh": "Tanh", "sigmoid": "Sigmoid", "relu": "Relu", "erf": "Erf", "reciprocal": "Reciprocal",
    "floor": "Floor", "ceil": "Ceil", "round": "Round", "sign": "Sign", "asin": "Asin", "acos": "Acos",
    "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh", "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh",
    "hardswish": "HardSwish",
}


def _unary(op: str):
    def fn(cv: Any, node: Any, x: Tensor, *rest: Any, **kw: Any) -> Tensor:
        out = cv.out_dtype()
        return cv.em.node(op, [cast(cv, x, out)], hint=node.name, shape=cv.out_dims(), dtype=out)

    return fn


for _name, _op in _UNARY.items():
    handles(f"{_name}.default")(_unary(_op))


@handles("isnan.default")
def _isnan(cv: Any, node: Any, x: Tensor) -> Tensor:
    return cv.em.node("IsNaN", [x], hint=node.name)


@handles("isinf.default")
def _isinf(cv: Any, node: Any, x: Tensor) -> Tensor:
    return cv.em.node("IsInf", [x], hint=node.name)


@handles("logical_not.default")
def _logical_not(cv: Any, node: Any, x: Tensor) -> Tensor:
    return cv.em.node("Not", [cast(cv, x, np.bool_)], hint=node.name)


@handles("bitwise_not.default")
def _bitwise_not(cv: Any, node: Any, x: Tensor) -> Tensor:
    op = "Not" if cv.dtype_of(x) == np.bool_ else "BitwiseNot"
    return cv.em.node(op, [x], hint=node.name)


@handles("rsqrt.default")
def _rsqrt(cv: Any, node: Any, x: Tensor) -> Tensor:
    out = cv.out_dtype()
    s = cv.em.node("Sqrt", [cast(cv, x, out)], shape=cv.out_dims(), dtype=out)
    return cv.em.node("Reciprocal", [s], hint=node.name)


@handles("log1p.default", "expm1.default", "log2.default", "log10.default", "exp2.default")
def _log_family(cv: Any, node: Any, x: Tensor) -> Tensor:
    out = cv.out_dtype()
    x = cast(cv, x, out)
    one = cv.em.const(np.array(1, out))
    name = node.target.__name__.split(".")[0]
    if name == "log1p":
        return cv.em.node("Log", [cv.em.node("Add", [x, one])], hint=node.name)
    if name == "expm1":
        return cv.em.node("Sub", [cv.em.node("Exp", [x]), one], hint=node.name)
    if name == "exp2":
        return cv.em.node("Pow", [cv.em.const(np.array(2, out)), x], hint=node.name)
    ln = cv.em.const(np.array(math.log(2 if name == "log2" else 10), out))
    return cv.em.node("Div", [cv.em.node("Log", [x]), ln], hint=node.name)


@handles("gelu.default")
def _gelu(cv: Any, node: Any, x: Tensor, approximate: str = "none") -> Tensor:
    out = cv.out_dtype()
    em, dims = cv.em, cv.out_dims()
    c = lambda v: em.const(np.array(v, out))  # noqa: E731
    if approximate == "tanh":
        cube = em.node("Mul", [em.node("Mul", [x, x], shape=dims), x], shape=dims)
        inner = em.node("Add", [x, em.node("Mul", [cube, c(0.044715)], shape=dims)], shape=dims)
        t = em.node("Tanh", [em.node("Mul", [inner, c(math.sqrt(2 / math.pi))], shape=dims)], shape=dims)
        half = em.node("Mul", [c(0.5), em.node("Add", [t, c(1.0)], shape=dims)], shape=dims)
        return em.node("Mul", [x, half], hint=node.name, shape=dims, dtype=out)
    e = em.node("Erf", [em.node("Div", [x, c(math.sqrt(2.0))], shape=dims)], shape=dims)
    half = em.node("Mul", [c(0.5), em.node("Add", [e, c(1.0)], shape=dims)], shape=dims)
    return em.node("Mul", [x, half], hint=node.name, shape=dims, dtype=out)


@handles("silu.default")
def _silu(cv: Any, node: Any, x: Tensor) -> Tensor:
    return cv.em.node("Mul", [x, cv.em.node("Sigmoid", [x], shape=cv.out_dims())], hint=node.name)


@handles("hardsigmoid.default")
def _hardsigmoid(cv: Any, node: Any, x: Tensor) -> Tensor:
    return cv.em.node("HardSigmoid", [x], {"alpha": 1.0 / 6.0, "beta": 0.5}, hint=node.name)


@handles("hardtanh.default")
def _hardtanh(cv: Any, node: Any, x: Tensor, lo: float = -1.0, hi: float = 1.0) -> Tensor:
    dt = cv.dtype_of(x)
    return cv.em.node("Clip", [x, tensor_of(cv, lo, dt), tensor_of(cv, hi, dt)], hint=node.name)


@handles("clamp.default", "clamp_min.default", "clamp_max.default")
def _clamp(cv: Any, node: Any, x: Tensor, lo: Any = None, hi: Any = None) -> Tensor:
    name = node.target.__name__.split(".")[0]
    if name == "clamp_max":
        lo, hi = None, lo
    out = cv.out_dtype()
    x = cast(cv, x, out)
    ins = [x, None if lo is None else tensor_of(cv, lo, out), None if hi is None else tensor_of(cv, hi, out)]
    while ins[-1] is None:
        ins.pop()
    if len(ins) == 1:
        return x
    return cv.em.node("Clip", ins, hint=node.name)


@handles("clamp.Tensor")
def _clamp_tensor(cv: Any, node: Any, x: Tensor, lo: Any = None, hi: Any = None) -> Tensor:
    out = cv.out_dtype()
    y = cast(cv, x, out)
    if lo is not None:
        y = cv.em.node("Max", [y, tensor_of(cv, lo, out)], shape=cv.out_dims())
    if hi is not None:
        y = cv.em.node("Min", [y, tensor_of(cv, hi, out)], shape=cv.out_dims())
    return y


@handles("leaky_relu.default")
def _leaky_relu(cv: Any, node: Any, x: Tensor, slope: float = 0.01) -> Tensor:
    return cv.em.node("LeakyRelu", [x], {"alpha": float(slope)}, hint=node.name)


@handles("elu.default")
def _elu(cv: Any, node: Any, x: Tensor, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Tensor:
    if scale != 1 or input_scale != 1:
        if abs(scale - 1.0507009873554805) < 1e-9 and abs(alpha - 1.6732632423543772) < 1e-9 and input_scale == 1:
            return cv.em.node("Selu", [x], {"alpha": float(alpha), "gamma": float(scale)}, hint=node.name)
        raise Unsupported("elu with scale or input_scale other than 1")
    return cv.em.node("Elu", [x], {"alpha": float(alpha)}, hint=node.name)


@handles("prelu.default", "_prelu_kernel.default")
def _prelu(cv: Any, node: Any, x: Tensor, w: Tensor) -> Tensor:
    rank, wr = len(cv.shape_of(x)), len(cv.shape_of(w))
    if wr == 1 and rank >= 2:  # per channel (axis 1)
        w = reshape(cv, w, (cv.shape_of(w)[0],) + (1,) * (rank - 2))
    return cv.em.node("PRelu", [x, w], hint=node.name)


def _binary(op: str, compare: bool = False):
    def fn(cv: Any, node: Any, a: Any, b: Any, *, alpha: Any = 1, **kw: Any) -> Tensor:
        out = cv.out_dtype()
        if op in ("Add", "Sub") and isinstance(a, Tensor) and b == 0 and not isinstance(b, Tensor) \
                and np.issubdtype(out, np.integer) and cv.dtype_of(a) == out:
            return a  # x + 0 on integers (ATen's arange(0, n) + 0); on floats it would turn -0.0 into 0.0
        compute = promoted(cv, node) if compare else out
        ta, tb = tensor_of(cv, a, compute), tensor_of(cv, b, compute)
        if alpha != 1:
            tb = cv.em.node("Mul", [tb, tensor_of(cv, alpha, compute)])
        if op == "Ne":
            eqn = cv.em.node("Equal", [ta, tb], shape=cv.out_dims(), dtype=np.bool_)
            return cv.em.node("Not", [eqn], hint=node.name)
        return cv.em.node(op, [ta, tb], hint=node.name)

    return fn


for _names, _op, _cmp in [
    (("add.Tensor", "add.Scalar"), "Add", False), (("sub.Tensor", "sub.Scalar"), "Sub", False),
    (("mul.Tensor", "mul.Scalar"), "Mul", False), (("div.Tensor", "div.Scalar"), "Div", False),
    (("maximum.default",), "Max", False), (("minimum.default",), "Min", False),
    (("pow.Tensor_Tensor", "pow.Scalar"), "Pow", False),
    (("eq.Tensor", "eq.Scalar"), "Equal", True), (("ne.Tensor", "ne.Scalar"), "Ne", True),
    (("lt.Tensor", "lt.Scalar"), "Less", True), (("le.Tensor", "le.Scalar"), "LessOrEqual", True),
    (("gt.Tensor", "gt.Scalar"), "Greater", True), (("ge.Tensor", "ge.Scalar"), "GreaterOrEqual", True),
]:
    handles(*_names)(_binary(_op, _cmp))


@handles("rsub.Scalar", "rsub.Tensor")
def _rsub(cv: Any, node: Any, a: Any, b: Any, alpha: Any = 1) -> Tensor:
    out = cv.out_dtype()
    ta = tensor_of(cv, a, out)
    if alpha != 1:
        ta = cv.em.node("Mul", [ta, tensor_of(cv, alpha, out)])
    return cv.em.node("Sub", [tensor_of(cv, b, out), ta], hint=node.name)


@handles("pow.Tensor_Scalar")
def _pow_scalar(cv: Any, node: Any, x: Tensor, e: Any) -> Tensor:
    out = cv.out_dtype()
    x = cast(cv, x, out)
    if e == 1:
        return x
    if e == 0.5 and np.issubdtype(out, np.floating):
        return cv.em.node("Sqrt", [x], hint=node.name)
    return cv.em.node("Pow", [x, tensor_of(cv, e, out if np.issubdtype(out, np.floating) else np.int64)],
                      hint=node.name)


@handles("div.Tensor_mode", "div.Scalar_mode", "floor_divide.default")
def _div_mode(cv: Any, node: Any, a: Any, b: Any, *, rounding_mode: str | None = "floor") -> Tensor:
    out = cv.out_dtype()
    ta, tb = tensor_of(cv, a, out), tensor_of(cv, b, out)
    em = cv.em
    if rounding_mode is None:
        return em.node("Div", [ta, tb], hint=node.name)
    if np.issubdtype(out, np.floating):
        q = em.node("Div", [ta, tb], shape=cv.out_dims(), dtype=out)
        if rounding_mode == "floor":
            return em.node("Floor", [q], hint=node.name)
        sign = em.node("Sign", [q])
        return em.node("Mul", [sign, em.node("Floor", [em.node("Abs", [q])])], hint=node.name)
    if rounding_mode == "trunc":
        return em.node("Div", [ta, tb], hint=node.name)  # ONNX integer Div truncates, as torch's trunc mode
    r = em.node("Mod", [ta, tb], {"fmod": 0})  # Python-style: a - mod(a, b) is a multiple of b
    return em.node("Div", [em.node("Sub", [ta, r]), tb], hint=node.name)


@handles("remainder.Tensor", "remainder.Scalar")
def _remainder(cv: Any, node: Any, a: Any, b: Any) -> Tensor:
    out = cv.out_dtype()
    ta, tb = tensor_of(cv, a, out), tensor_of(cv, b, out)
    if np.issubdtype(out, np.floating):  # a - floor(a / b) * b (ONNX Mod requires fmod=1 for floats)
        q = cv.em.node("Floor", [cv.em.node("Div", [ta, tb])])
        return cv.em.node("Sub", [ta, cv.em.node("Mul", [q, tb])], hint=node.name)
    return cv.em.node("Mod", [ta, tb], {"fmod": 0}, hint=node.name)


@handles("fmod.Tensor", "fmod.Scalar")
def _fmod(cv: Any, node: Any, a: Any, b: Any) -> Tensor:
    out = cv.out_dtype()
    return cv.em.node("Mod", [tensor_of(cv, a, out), tensor_of(cv, b, out)], {"fmod": 1}, hint=node.name)


def _logical(op: str):
    def fn(cv: Any, node: Any, a: Any, b: Any) -> Tensor:
        out = cv.out_dtype()
        if out == np.bool_:
            return cv.em.node(op, [tensor_of(cv, a, np.bool_), tensor_of(cv, b, np.bool_)], hint=node.name)
        if node.target.__name__.startswith("logical"):
            r = cv.em.node(op, [tensor_of(cv, a, np.bool_), tensor_of(cv, b, np.bool_)])
            return cast(cv, r, out)
        return cv.em.node(f"Bitwise{op}", [tensor_of(cv, a, out), tensor_of(cv, b, out)], hint=node.name)

    return fn


for _n, _o in (("and", "And"), ("or", "Or"), ("xor", "Xor")):
    handles(f"logical_{_n}.default", f"bitwise_{_n}.Tensor", f"bitwise_{_n}.Scalar")(_logical(_o))


@handles("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(cv: Any, node: Any, c: Any, a: Any, b: Any) -> Tensor:
    out = cv.out_dtype()
    return cv.em.node("Where", [tensor_of(cv, c, np.bool_), tensor_of(cv, a, out), tensor_of(cv, b, out)],
                      hint=node.name)


# ---- reductions ------------------------------------------------------------------------------------------
def _axes(cv: Any, x: Tensor, dims: Any) -> list[int]:
    rank = len(cv.shape_of(x))
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({axis(static_int(d, "a reduction dim"), rank) for d in dims})


def _reduce(op: str, *, bool_via: str | None = None):
    def fn(cv: Any, node: Any, x: Tensor, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
        out = cv.out_dtype()
        src = x
        if bool_via is not None:
            src = cast(cv, x, np.int32)
        elif cv.dtype_of(x) != out:
            src = cast(cv, x, out)
        if len(cv.shape_of(x)) == 0:
            return cast(cv, src, out)
        axes = _axes(cv, x, dims)
        r = cv.em.node(op, [src, cv.em.ints(axes)], {"keepdims": int(bool(keepdim))}, hint=node.name,
                       shape=cv.out_dims(), dtype=cv.dtype_of(src))
        return cast(cv, r, out)

    return fn


handles("sum.dim_IntList", "sum.default")(_reduce("ReduceSum"))
_mean = handles("mean.default")(_reduce("ReduceMean"))


@handles("mean.dim")
def _mean_dim(cv: Any, node: Any, x: Tensor, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """A mean over every spatial axis, kept, is GlobalAveragePool (adaptive_avg_pool2d(x, 1) decomposes to it),
    the form torch.onnx exports and CNN kernels look for."""
    rank = len(cv.shape_of(x))
    if keepdim and rank >= 3 and _axes(cv, x, dims) == list(range(2, rank)) and cv.out_dtype() == cv.dtype_of(x):
        return cv.em.node("GlobalAveragePool", [x], hint=node.name)
    return _mean(cv, node, x, dims, keepdim, dtype=dtype)
handles("amax.default")(_reduce("ReduceMax"))
handles("amin.default")(_reduce("ReduceMin"))
handles("any.dim", "any.dims", "any.default")(_reduce("ReduceMax", bool_via="int"))
handles("all.dim", "all.dims", "all.default")(_reduce("ReduceMin", bool_via="int"))
handles("prod.dim_int", "prod.default")(_reduce("ReduceProd"))


@handles("max.default", "min.default")
def _max_all(cv: Any, node: Any, x: Tensor) -> Tensor:
    op = "ReduceMax" if node.target.__name__.startswith("max") else "ReduceMin"
    return cv.em.node(op, [x, cv.em.ints(_axes(cv, x, None))], {"keepdims": 0}, hint=node.name)


@handles("max.dim", "min.dim")
def _max_dim(cv: Any, node: Any, x: Tensor, dim: int, keepdim: bool = False) -> tuple:
    is_max = node.target.__name__.startswith("max")
    ax = _axes(cv, x, [dim])
    v = cv.em.node("ReduceMax" if is_max else "ReduceMin", [x, cv.em.ints(ax)], {"keepdims": int(keepdim)},
                   hint=node.name, shape=cv.out_dims(index=0), dtype=cv.dtype_of(x))
    i = cv.em.node("ArgMax" if is_max else "ArgMin", [x], {"axis": ax[0], "keepdims": int(keepdim)},
                   shape=cv.out_dims(index=1), dtype=np.int64)
    return (v, i)


@handles("argmax.default", "argmin.default")
def _argmax(cv: Any, node: Any, x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    op = "ArgMax" if node.target.__name__.startswith("argmax") else "ArgMin"
    if dim is None:
        x = reshape(cv, x, (_numel(cv.shape_of(x)),))
        dim, keepdim = 0, False
    ax = _axes(cv, x, [dim])[0]
    r = cv.em.node(op, [x], {"axis": ax, "keepdims": int(keepdim)}, shape=cv.out_dims(), dtype=np.int64)
    return reshape(cv, r, cv.out_dims(), hint=node.name) if cv.shape_of(r) != cv.out_dims() else r


def _numel(dims: tuple) -> Any:
    n: Any = 1
    for d in dims:
        n = n * d
    return n


@handles("var.correction", "var_mean.correction", "std.correction")
def _var(cv: Any, node: Any, x: Tensor, dims: Any = None, *, correction: Any = 1, keepdim: bool = False) -> Any:
    name = node.target.__name__.split(".")[0]
    em = cv.em
    out = cv.out_dtype(index=0) if name == "var_mean" else cv.out_dtype()
    x = cast(cv, x, out)
    axes = _axes(cv, x, dims)
    shape = cv.shape_of(x)
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    mean = em.node("ReduceMean", [x, em.ints(axes)], {"keepdims": 1}, shape=kept, dtype=out)
    diff = em.node("Sub", [x, mean], shape=shape, dtype=out)
    ss = em.node("ReduceSum", [em.node("Mul", [diff, diff], shape=shape, dtype=out), em.ints(axes)],
                 {"keepdims": int(keepdim)}, dtype=out)
    n: Any = 1
    for i in axes:
        n = n * shape[i]
    corr = 1 if correction is None else correction
    denom = tensor_of(cv, n - corr if not isinstance(n, int) or n - corr > 0 else 0, out)
    var = em.node("Div", [ss, denom], hint=node.name, dtype=out)
    if name == "std":
        return em.node("Sqrt", [var], hint=node.name)
    if name == "var_mean":
        m = mean if keepdim else em.node("Squeeze", [mean, em.ints(axes)], dtype=out)
        return (var, m)
    return var


@handles("cumsum.default", "cumprod.default")
def _cumsum(cv: Any, node: Any, x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    out = cv.out_dtype()
    op = "CumSum" if node.target.__name__.startswith("cumsum") else "CumProd"
    ax = axis(dim, len(cv.shape_of(x)))
    return cv.em.node(op, [cast(cv, x, out), cv.em.const(np.array(ax, np.int64))], hint=node.name)


# ---- softmax ---------------------------------------------------------------------------------------------
@handles("_softmax.default", "_log_softmax.default")
def _softmax(cv: Any, node: Any, x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    op = "Softmax" if node.target.__name__.startswith("_softmax") else "LogSoftmax"
    out = cv.out_dtype()
    return cv.em.node(op, [cast(cv, x, out)], {"axis": axis(dim, len(cv.shape_of(x)))}, hint=node.name)


@handles("_safe_softmax.default")
def _safe_softmax(cv: Any, node: Any, x: Tensor, dim: int, dtype: Any = None) -> Tensor:
    out = cv.out_dtype()
    return safe_softmax(cv, cast(cv, x, out), axis(dim, len(cv.out_dims())), cv.out_dims(), out, node.name)


def safe_softmax(cv: Any, x: Tensor, ax: int, dims: tuple, out: Any, hint: str) -> Tensor:
    """softmax whose fully masked rows (every score -inf) give 0 instead of NaN.

    Default: Where(IsNaN(p), 0, p), torch.onnx's lowering, which the attention fusion runs without
    materialising the scores; it differs from torch only on rows whose scores hold NaN or +inf (0 instead of
    NaN). `exact_safe_softmax=True`: Where(ReduceMax(x) == -inf, 0, p), torch's exact rule, not fused."""
    em = cv.em
    p = em.node("Softmax", [x], {"axis": ax}, shape=dims, dtype=out)
    zero = em.const(np.array(0, out))
    if cv.exact_safe_softmax:
        m = em.node("ReduceMax", [x, em.ints([ax])], {"keepdims": 1}, dtype=out)
        dead = em.node("Equal", [m, em.const(np.array(-np.inf, out))], dtype=np.bool_)
    else:
        dead = em.node("IsNaN", [p], shape=dims, dtype=np.bool_)
    return em.node("Where", [dead, zero, p], hint=hint, shape=dims, dtype=out)


# ---- products --------------------------------------------------------------------------------------------
def _unflattened(cv: Any, a: Tensor) -> Tensor | None:
    """The >= 3-D value (lead..., k) a 2-D operand (rows, k) was flattened from: the first source of its chain of
    views, reshaped so its trailing dims make k (attention's (b, s, heads, d) -> (b, s, heads * d)); else None."""
    r = root(cv, a)
    if r.name == a.name:
        return None
    dims = cv.shape_of(r)
    rows, k = cv.shape_of(a)
    for cut in range(len(dims) - 1, 1, -1):  # the longest leading part whose product is the row count
        if _numel(dims[:cut]) == rows and _numel(dims[cut:]) == k:
            return r if cut == len(dims) - 1 else reshape(cv, r, (*dims[:cut], k))
    return None


def _matmul_nd(cv: Any, node: Any, a: Tensor, b: Tensor, bias: Any = None, beta: Any = 1, alpha: Any = 1) -> Tensor:
    em = cv.em
    out_dt = cv.out_dtype()
    full = _unflattened(cv, a) if len(cv.shape_of(a)) == 2 else None
    lhs = full if full is not None else a
    lead = cv.shape_of(lhs)[:-1]
    n = cv.shape_of(b)[-1]
    dims = (*lead, n)
    y = em.node("MatMul", [lhs, b], hint=None if bias is not None or full is not None else node.name,
                shape=dims, dtype=out_dt)
    if alpha != 1:
        y = em.node("Mul", [y, tensor_of(cv, alpha, out_dt)], shape=dims, dtype=out_dt)
    if bias is not None:
        bt = tensor_of(cv, bias, out_dt)
        if beta != 1:
            bt = em.node("Mul", [bt, tensor_of(cv, beta, out_dt)])
        y = em.node("Add", [y, bt], hint=None if full is not None else node.name, shape=dims, dtype=out_dt)
    if full is not None:
        return reshape(cv, y, cv.out_dims(), hint=node.name)
    return y


@handles("mm.default")
def _mm(cv: Any, node: Any, a: Tensor, b: Tensor) -> Tensor:
    return _matmul_nd(cv, node, a, b)


@handles("addmm.default")
def _addmm(cv: Any, node: Any, bias: Any, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return _matmul_nd(cv, node, a, b, bias, beta, alpha)


def _unexpanded(cv: Any, t: Tensor) -> Tensor:
    """The value a batch of identical matrices was broadcast from (Expand over leading dims only), else t."""
    r = root(cv, t)
    src = cv.expanded.get(r.name)
    if src is None:
        return t
    ds, dt = cv.shape_of(src), cv.shape_of(t)
    if len(ds) >= 2 and ds[-2:] == dt[-2:] and all(isinstance(d, int) and d == 1 for d in ds[:-2]):
        return src if len(ds) == 2 else reshape(cv, src, ds[-2:])
    return t


@handles("bmm.default")
def _bmm(cv: Any, node: Any, a: Tensor, b: Tensor) -> Tensor:
    """A batched product of flattened (B*H, m, k) views runs on the 4-D (B, H, m, k) sources instead, so the
    attention fusion sees MatMul(Q, K^T) -> Softmax -> MatMul(P, V) on the heads layout; a product by one matrix
    broadcast over the batch (torch's matmul of a 3-D input by a weight) is a product by that matrix."""
    wb = _unexpanded(cv, b)
    if wb.name != b.name and len(cv.shape_of(wb)) == 2:
        return cv.em.node("MatMul", [root(cv, a) if cv.shape_of(root(cv, a)) == cv.shape_of(a) else a, wb],
                          hint=node.name)
    ra, rb = root(cv, a), root(cv, b)
    da, db = cv.shape_of(ra), cv.shape_of(rb)
    sa, sb = cv.shape_of(a), cv.shape_of(b)
    if (ra.name != a.name and rb.name != b.name and len(da) == len(db) >= 4 and da[:-2] == db[:-2]
            and da[-2:] == sa[1:] and db[-2:] == sb[1:] and _numel(da[:-2]) == sa[0]):
        y = cv.em.node("MatMul", [ra, rb], shape=(*da[:-1], db[-1]), dtype=cv.out_dtype())
        return reshape(cv, y, cv.out_dims(), hint=node.name)
    return cv.em.node("MatMul", [a, b], hint=node.name)


@handles("baddbmm.default")
def _baddbmm(cv: Any, node: Any, c: Tensor, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    out = cv.out_dtype()
    y = _bmm(cv, node, a, b)
    if alpha != 1:
        y = cv.em.node("Mul", [y, tensor_of(cv, alpha, out)])
    ct = c if beta == 1 else cv.em.node("Mul", [c, tensor_of(cv, beta, out)])
    return cv.em.node("Add", [y, ct], hint=node.name)


@handles("dot.default", "mv.default")
def _dot(cv: Any, node: Any, a: Tensor, b: Tensor) -> Tensor:
    return cv.em.node("MatMul", [a, b], hint=node.name)
