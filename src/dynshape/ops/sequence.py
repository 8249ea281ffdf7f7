"""Sequence ops beside the ones control flow needs (ops/control.py): SplitToSequence, SequenceMap,
ConcatFromSequence, SequenceErase.

A sequence's elements may differ in shape, so a `SequenceType` carries their common shape when every element
provably has it and otherwise only their common rank; an element taken out of the latter gets fresh dims,
bound by the executor when it sees the tensor. Sequence lengths are run-time values: a dim that counts elements
(ConcatFromSequence's axis) is fresh.
"""

from __future__ import annotations

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import SequenceType, TensorType
from dynshape.ops.control import seq_elem
from dynshape.ops.dims import arg_value, axis_of, is_static, norm


# ---------------------------------------------------------------------------------------------------------
# SplitToSequence
# ---------------------------------------------------------------------------------------------------------
def _split_to_sequence_ref(inputs: list, attrs: dict) -> list:
    x = inputs[0]
    split = inputs[1] if len(inputs) > 1 else None
    axis = axis_of(attrs.get("axis", 0), x.ndim)
    d = x.shape[axis]
    if split is None:
        parts = np.split(x, d, axis=axis) if d else []
        if not attrs.get("keepdims", 1):
            parts = [np.squeeze(p, axis=axis) for p in parts]
        return [parts]
    sizes = [int(v) for v in np.asarray(split).reshape(-1)]
    if np.ndim(split) == 0:  # equal chunks of that size, the last one shorter
        k = sizes[0]
        if k <= 0:
            raise ValueError(f"split must be positive, got {k}")
        sizes = [k] * (d // k) + ([d % k] if d % k else [])
    if sum(sizes) != d or any(s < 0 for s in sizes):
        raise ValueError(f"split lengths {sizes} do not add up to the axis length {d}")
    return [np.split(x, np.cumsum(sizes)[:-1], axis=axis) if sizes else []]


def _split_to_sequence_rule(ctx: InferCtx) -> list[SequenceType]:
    x = ctx.inputs[0]
    split = ctx.inputs[1] if len(ctx.inputs) > 1 else None
    try:
        axis = axis_of(ctx.attr("axis", 0), x.rank)
    except ValueError as e:
        ctx.error(str(e))
    shape = list(x.shape)
    if split is None:
        if ctx.attr("keepdims", 1):
            shape[axis] = 1
        else:
            del shape[axis]
        return [SequenceType(x.dtype, tuple(shape))]
    vals = arg_value(ctx, 1)
    if vals is not None and split.rank == 0 and is_static(vals[0]) and is_static(x.shape[axis]) \
            and x.shape[axis] % vals[0] == 0:
        shape[axis] = int(vals[0])
        return [SequenceType(x.dtype, tuple(shape))]
    if vals is not None and split.rank == 1 and vals and len({norm(v) for v in vals}) == 1:
        shape[axis] = norm(vals[0])
        return [SequenceType(x.dtype, tuple(shape))]
    return [SequenceType(x.dtype, None, x.rank)]  # chunks may differ along axis


register("SplitToSequence", reference=_split_to_sequence_ref, infer=_split_to_sequence_rule)


# ---------------------------------------------------------------------------------------------------------
# SequenceMap: run the body once per element (sequences are iterated, tensors passed whole)
# ---------------------------------------------------------------------------------------------------------
def _sequence_map_ref(inputs: list, attrs: dict) -> list:
    from dynshape.ir.execute import run_subgraph

    body = attrs["body"]
    n = len(inputs[0])
    for i, x in enumerate(inputs):
        if isinstance(x, list) and len(x) != n:
            raise ValueError(f"input sequence {i} has {len(x)} elements, the first has {n}")
    outs: list[list] = [[] for _ in body.outputs]
    for k in range(n):
        args = [x[k] if isinstance(x, list) else x for x in inputs]
        for j, y in enumerate(run_subgraph(body, args, attrs.get("_scope", {}), attrs.get("_env", {}))):
            outs[j].append(y)
    return outs


def _sequence_map_rule(ctx: InferCtx) -> list[SequenceType]:
    body = ctx.attr("body")
    mark = ctx.mark()
    args = [seq_elem(ctx, t, f"input {i}") if isinstance(t, SequenceType) else t for i, t in enumerate(ctx.inputs)]
    outs = ctx.infer_subgraph(body, args)
    res = []
    for t in outs:
        if not isinstance(t, TensorType):
            ctx.error(f"the body must return tensors, got {t}")
        local = any(ctx.is_local(d, mark) for d in t.shape)
        res.append(SequenceType(t.dtype, None, t.rank) if local else SequenceType(t.dtype, t.shape))
    return res


register("SequenceMap", reference=_sequence_map_ref, infer=_sequence_map_rule)


# ---------------------------------------------------------------------------------------------------------
# ConcatFromSequence / SequenceErase
# ---------------------------------------------------------------------------------------------------------
def _concat_from_sequence_ref(inputs: list, attrs: dict) -> list:
    seq = inputs[0]
    if not seq:
        raise ValueError("ConcatFromSequence of an empty sequence")
    axis = attrs["axis"]
    if attrs.get("new_axis", 0):
        return [np.stack(seq, axis=axis_of(axis, seq[0].ndim + 1))]
    return [np.concatenate(seq, axis=axis_of(axis, seq[0].ndim))]


def _concat_from_sequence_rule(ctx: InferCtx) -> list[TensorType]:
    s = ctx.inputs[0]
    if not isinstance(s, SequenceType):
        ctx.error("the input must be a sequence")
    elem = seq_elem(ctx, s)
    new = bool(ctx.attr("new_axis", 0))
    axis = ctx.attr("axis")
    if axis is None:
        ctx.error("the 'axis' attribute is required")
    try:
        axis = axis_of(axis, elem.rank + (1 if new else 0))
    except ValueError as e:
        ctx.error(str(e))
    shape = list(elem.shape)
    count = ctx.fresh("seq_concat")  # how many elements (times their length) is a run-time value
    if new:
        shape.insert(axis, count)
    else:
        shape[axis] = count
    return [TensorType(s.dtype, tuple(shape))]


register("ConcatFromSequence", reference=_concat_from_sequence_ref, infer=_concat_from_sequence_rule)


def _sequence_erase_ref(inputs: list, attrs: dict) -> list:
    seq = list(inputs[0])
    pos = len(seq) - 1 if len(inputs) < 2 or inputs[1] is None else int(np.asarray(inputs[1]).reshape(-1)[0])
    if not -len(seq) <= pos < len(seq):
        raise ValueError(f"position {pos} is outside a sequence of {len(seq)}")
    del seq[pos]
    return [seq]


register("SequenceErase", reference=_sequence_erase_ref, infer=lambda ctx: [ctx.inputs[0]])
