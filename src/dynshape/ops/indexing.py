"""Indexing ops: Gather, GatherElements, GatherND, Scatter*, OneHot, EyeLike, and the ops whose output size
depends on data (NonZero, Compress, Unique: their sizes are fresh symbols).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ops.dims import (
    I64,
    axis_of,
    is_static,
    make_value,
    out_type,
    prod,
    same_as_input_infer,
    value_list,
)


# ----------------------------------------------------------------------------------------------------
# Gather, GatherElements, GatherND, ScatterND, ScatterElements, Scatter
# ----------------------------------------------------------------------------------------------------
def _gather_ref(inputs: list, attrs: dict) -> list:
    x, idx = inputs
    return [np.take(x, idx.astype(np.int64), axis=axis_of(attrs.get("axis", 0), x.ndim))]


def _gather_infer(ctx: InferCtx) -> list:
    x, idx = ctx.inputs[:2]
    a = axis_of(ctx.attr("axis", 0), x.rank)
    shape = list(x.shape[:a]) + list(idx.shape) + list(x.shape[a + 1 :])
    value = None
    iv = value_list(idx)
    if x.value is not None and iv is not None and all(is_static(i) for i in iv):
        taken = np.take(np.asarray(x.value), np.array(iv, dtype=np.int64).reshape(idx.shape), axis=a)
        value = make_value(taken, x.dtype)
    return [out_type(x.dtype, shape, value)]


register("Gather", reference=_gather_ref, infer=_gather_infer)


def _positive(idx: np.ndarray, dim: Any) -> np.ndarray:
    idx = idx.astype(np.int64)
    return np.where(idx < 0, idx + dim, idx)


def _gather_elements_ref(inputs: list, attrs: dict) -> list:
    x, idx = inputs
    a = axis_of(attrs.get("axis", 0), x.ndim)
    # out[i] = x[i with axis a replaced by idx[i]]: the output has idx's shape, which may be smaller than x's
    # on the other axes too (np.take_along_axis would broadcast idx against x there instead)
    where = list(np.indices(idx.shape, sparse=True))
    where[a] = _positive(idx, x.shape[a])
    return [x[tuple(where)]]


def _indices_shaped_infer(ctx: InferCtx) -> list:
    """Output shaped like input 1 (the indices), typed like input 0."""
    return [out_type(ctx.inputs[0].dtype, ctx.inputs[1].shape)]


register("GatherElements", reference=_gather_elements_ref, infer=_indices_shaped_infer)


def _gather_nd_ref(inputs: list, attrs: dict) -> list:
    x, idx = inputs
    b = int(attrs.get("batch_dims", 0))
    k = idx.shape[-1]
    idx = _positive(idx, np.array(x.shape[b : b + k]))
    nb = int(np.prod(x.shape[:b]))
    flat_x = x.reshape((nb, *x.shape[b:]))
    flat_i = idx.reshape(nb, -1, k)
    batch = np.arange(nb)[:, None]
    out = flat_x[(batch, *np.moveaxis(flat_i, -1, 0))]
    return [out.reshape(idx.shape[:-1] + x.shape[b + k :])]


def _gather_nd_infer(ctx: InferCtx) -> list:
    x, idx = ctx.inputs[:2]
    b = int(ctx.attr("batch_dims", 0))
    k = ctx.static(idx.shape[-1], "the last indices dim")
    return [out_type(x.dtype, list(idx.shape[:-1]) + list(x.shape[b + int(k) :]))]


register("GatherND", reference=_gather_nd_ref, infer=_gather_nd_infer)

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_into(x: np.ndarray, where: tuple, upd: np.ndarray, reduction: str) -> np.ndarray:
    out = x.copy()
    if reduction == "none":
        out[where] = upd
    else:
        _REDUCE[reduction].at(out, where, upd)
    return out


def _scatter_nd_ref(inputs: list, attrs: dict) -> list:
    x, idx, upd = inputs
    k = idx.shape[-1]
    idx = _positive(idx, np.array(x.shape[:k])).reshape(-1, k)
    where = tuple(idx.T)
    return [_scatter_into(x, where, upd.reshape((-1, *x.shape[k:])), attrs.get("reduction", "none"))]


def _scatter_elements_ref(inputs: list, attrs: dict) -> list:
    x, idx, upd = inputs
    a = axis_of(attrs.get("axis", 0), x.ndim)
    where = list(np.indices(idx.shape, sparse=True))
    where[a] = _positive(idx, x.shape[a])
    return [_scatter_into(x, tuple(where), upd, attrs.get("reduction", "none"))]



register("ScatterND", reference=_scatter_nd_ref, infer=same_as_input_infer)
register("ScatterElements", reference=_scatter_elements_ref, infer=same_as_input_infer)
register("Scatter", reference=_scatter_elements_ref, infer=same_as_input_infer)

# ----------------------------------------------------------------------------------------------------
# data-dependent sizes: NonZero, Compress, Unique
# ----------------------------------------------------------------------------------------------------
def _non_zero_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    if x.ndim == 0:
        return [np.zeros((0, int(bool(x))), dtype=np.int64)]
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


def _non_zero_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    return [out_type(I64, (x.rank, ctx.fresh("nonzero")))]


register("NonZero", reference=_non_zero_ref, infer=_non_zero_infer)


def _compress_ref(inputs: list, attrs: dict) -> list:
    x, cond = inputs
    a = attrs.get("axis")
    return [np.compress(cond.astype(bool), x, axis=None if a is None else axis_of(a, x.ndim))]


def _compress_infer(ctx: InferCtx) -> list:
    x, cond = ctx.inputs[:2]
    cv = value_list(cond)
    n = ctx.fresh("compress") if cv is None else sum(bool(c) for c in cv)
    a = ctx.attr("axis", None)
    if a is None:
        return [out_type(x.dtype, (n,))]
    shape = list(x.shape)
    shape[axis_of(a, x.rank)] = n
    return [out_type(x.dtype, shape)]


register("Compress", reference=_compress_ref, infer=_compress_infer)


def _unique_ref(inputs: list, attrs: dict) -> list:
    x, a = inputs[0], attrs.get("axis")
    a = None if a is None else axis_of(a, x.ndim)
    y, first, inv, counts = np.unique(
        x.reshape(-1) if a is None else x, axis=a, return_index=True, return_inverse=True, return_counts=True
    )
    inv = inv.reshape(-1)
    if not attrs.get("sorted", 1):  # order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        y, first, inv, counts = np.take(y, order, axis=0 if a is None else a), first[order], rank[inv], counts[order]
    return [y, first.astype(np.int64), inv.astype(np.int64), counts.astype(np.int64)]


def _unique_infer(ctx: InferCtx) -> list:
    x, a = ctx.inputs[0], ctx.attr("axis", None)
    u = ctx.fresh("unique")
    if a is None:
        y, n = (u,), prod(x.shape)
    else:
        a = axis_of(a, x.rank)
        y, n = tuple(u if i == a else d for i, d in enumerate(x.shape)), x.shape[a]
    return [out_type(x.dtype, y), out_type(I64, (u,)), out_type(I64, (n,)), out_type(I64, (u,))]


register("Unique", reference=_unique_ref, infer=_unique_infer)


def _one_hot_ref(inputs: list, attrs: dict) -> list:
    idx, depth, values = inputs
    depth = int(np.asarray(depth).reshape(-1)[0])
    a = axis_of(attrs.get("axis", -1), idx.ndim + 1)
    idx = np.expand_dims(_positive(idx, depth), a)
    hot = np.arange(depth).reshape([depth if i == a else 1 for i in range(idx.ndim)]) == idx
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


def _one_hot_infer(ctx: InferCtx) -> list:
    idx, depth, values = ctx.inputs[:3]
    d = value_list(depth)
    d = ctx.fresh("one_hot") if d is None else (int(d[0]) if isinstance(d[0], float) else d[0])
    shape = list(idx.shape)
    shape.insert(axis_of(ctx.attr("axis", -1), idx.rank + 1), d)
    return [out_type(values.dtype, shape)]


register("OneHot", reference=_one_hot_ref, infer=_one_hot_infer)


def _eye_dtype(get: Any, x_dtype: np.dtype) -> np.dtype:
    code = get("dtype", None)
    if code is None:
        return np.dtype(x_dtype)
    from onnx.helper import tensor_dtype_to_np_dtype

    return np.dtype(tensor_dtype_to_np_dtype(int(code)))


def _eye_like_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    return [np.eye(x.shape[0], x.shape[1], int(attrs.get("k", 0)), dtype=_eye_dtype(attrs.get, x.dtype))]


def _eye_like_infer(ctx: InferCtx) -> list:
    x = ctx.inputs[0]
    return [out_type(_eye_dtype(ctx.attr, x.dtype), x.shape)]


register("EyeLike", reference=_eye_like_ref, infer=_eye_like_infer)
