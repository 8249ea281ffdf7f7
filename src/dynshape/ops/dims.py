"""Dim and value helpers the shape rules share: an int fast path, the symbolic engine otherwise.

Dims are `int | Expr`; these helpers use plain Python arithmetic on ints and the symbolic engine otherwise, so
every rule also works on fully static shapes. Value helpers read and build `TensorType.value` (arrays of
`int | Expr`), which is how exact shapes survive exporters' Shape -> Gather -> Concat -> Reshape chains.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.types import TensorType
from dynshape.sym import ceil_div as sym_ceil_div
from dynshape.sym import divides, eq, max_, min_, prove

I64 = np.dtype(np.int64)
# An index at least this large (in magnitude) means "past the end": no array can have a dim this big.
HUGE = 2**62
# Largest value array a growing op (Expand, Tile, ConstantOfShape, Range) materialises in a shape rule.
MAX_VALUE_SIZE = 1 << 16

# ----------------------------------------------------------------------------------------------------
# dim helpers (int fast path, symbolic engine otherwise)
# ----------------------------------------------------------------------------------------------------
def is_static(d: Any) -> bool:
    return isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_))


def norm(x: Any) -> Any:
    """numpy ints -> int (Expr arithmetic only has to understand Python ints)."""
    return int(x) if isinstance(x, np.integer) else x


def decide(cond: Any) -> bool | None:
    """True / False / None (unknown) for a comparison built from ints or Exprs."""
    if isinstance(cond, (bool, np.bool_)):
        return bool(cond)
    return prove(cond)


def dim_eq(a: Any, b: Any) -> bool | None:
    if is_static(a) and is_static(b):
        return int(a) == int(b)
    return prove(eq(a, b))


def dmin(a: Any, b: Any) -> Any:
    return min(a, b) if is_static(a) and is_static(b) else min_(a, b)


def dmax(a: Any, b: Any) -> Any:
    return max(a, b) if is_static(a) and is_static(b) else max_(a, b)


def ceil_div(a: Any, b: Any) -> Any:
    return -(-a // b) if is_static(a) and is_static(b) else sym_ceil_div(a, b)


def prod(dims: Any) -> Any:
    out: Any = 1
    for d in dims:
        out = out * norm(d)
    return out


def require_eq(ctx: InferCtx, a: Any, b: Any, what: str) -> None:
    """Record `a == b`; a plain-int mismatch is a node-named error."""
    if is_static(a) and is_static(b):
        if a != b:
            ctx.error(f"{what}: {a} != {b}")
    else:
        ctx.require(eq(a, b))


def require_divides(ctx: InferCtx, k: Any, e: Any, what: str) -> None:
    """Record that `k` divides `e` (needed by an exact `e // k`)."""
    if is_static(k) and is_static(e):
        if k == 0 or e % k:
            ctx.error(f"{what}: {k} does not divide {e}")
    elif not (is_static(k) and k == 1):
        ctx.require(divides(k, e))


def axis_of(a: Any, rank: int) -> int:
    a = int(a)
    if not -rank <= a < max(rank, 1):
        raise ValueError(f"axis {a} out of range for rank {rank}")
    return a + rank if a < 0 else a


# ----------------------------------------------------------------------------------------------------
# value helpers
# ----------------------------------------------------------------------------------------------------
def value_list(t: TensorType | None) -> list | None:
    """The known contents of `t`, flattened, as `int | Expr` (or floats); None when unknown."""
    if t is None or t.value is None:
        return None
    return [norm(v) for v in np.asarray(t.value).reshape(-1).tolist()]


def make_value(items: Any, dtype: np.dtype, shape: Any = None) -> np.ndarray:
    """A value array: numeric when every item is a number, else an object array of `int | Expr`."""
    if isinstance(items, np.ndarray) and items.dtype != object:  # numbers already (a Reshape of a 1M-float weight:
        # 0.3 s item by item)
        return np.asarray(items, dtype=dtype).reshape(np.shape(items) if shape is None else tuple(shape))
    flat = [norm(v) for v in np.asarray(items, dtype=object).reshape(-1)]
    shape = np.shape(items) if shape is None else tuple(shape)
    if all(isinstance(v, (int, float, bool, np.generic)) for v in flat):
        return np.array(flat, dtype=dtype).reshape(shape)
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape)


def apply_value(t: TensorType | None, fn: Any, dtype: np.dtype) -> np.ndarray | None:
    """Run a pure data-movement numpy function on a known value (object arrays work unchanged)."""
    if t is None or t.value is None:
        return None
    return make_value(fn(np.asarray(t.value)), dtype)


def static_shape(shape: Any) -> bool:
    return all(is_static(d) for d in shape)


def out_type(dtype: Any, shape: Any, value: np.ndarray | None = None) -> TensorType:
    return TensorType(np.dtype(dtype), tuple(norm(d) for d in shape), value)


def ints(x: Any) -> list[int]:
    return [int(v) for v in np.asarray(x).reshape(-1)]


def arg_value(ctx: InferCtx, idx: int | None, attr: str | None = None) -> list | None:
    """Known values of an op parameter: input `idx` (newer opsets) or attribute `attr` (older ones)."""
    if idx is not None and len(ctx.inputs) > idx and ctx.inputs[idx] is not None:
        return value_list(ctx.inputs[idx])
    v = None if attr is None else ctx.attr(attr, None)
    return None if v is None else [norm(x) for x in np.asarray(v).reshape(-1).tolist()]


def arg_given(ctx: InferCtx, idx: int, attr: str | None = None) -> bool:
    return (len(ctx.inputs) > idx and ctx.inputs[idx] is not None) or (attr is not None and ctx.attr(attr) is not None)


def ref_arg(inputs: list, idx: int, attrs: dict, attr: str | None = None) -> list[int] | None:
    if len(inputs) > idx and inputs[idx] is not None:
        return ints(inputs[idx])
    return None if attr is None or attrs.get(attr) is None else ints(attrs[attr])

def static_len(ctx: InferCtx, t: TensorType) -> int:
    """Length of a 1-D parameter tensor, which fixes an output rank: an input symbol here makes the graph
    specialise on its value (`InferCtx.static`)."""
    n = t.shape[0] if t.shape else 1
    return ctx.static(n, "the length of a shape/axes tensor")

def same_as_input_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    return [out_type(x.dtype, x.shape)]
