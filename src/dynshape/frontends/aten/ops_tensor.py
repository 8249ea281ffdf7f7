"""Data movement, views, factories and indexing.

ATen graphs are full of no-op movement: `clone` to make a value contiguous, `expand` to the shape a value
already has, `slice(x, 0, 0, INT64_MAX)`, permutations that undo each other. Those become no node at all, so
the compiler sees the same graph whatever strides torch happened to trace with (a batch-1 graph then
matches the batch-B graph it specialises).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.frontends.aten.common import (
    INT64_MAX,
    axis,
    cast,
    reshape,
    static_int,
    tensor_of,
)
from dynshape.frontends.aten.convert import handles
from dynshape.frontends.aten.emit import Tensor
from dynshape.frontends.aten.symbols import Unsupported
from dynshape.sym import is_expr


@handles("clone.default", "alias.default", "detach.default", "lift_fresh_copy.default", "contiguous.default",
         "_assert_tensor_metadata.default", "dropout.default", "native_dropout.default")
def _identity(cv: Any, node: Any, x: Any, *rest: Any, **kw: Any) -> Any:
    if node.target.__name__.startswith("native_dropout"):
        return (x, cv.em.const(np.ones([1] * len(cv.shape_of(x)), np.bool_)))
    return x


@handles("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default")
def _view(cv: Any, node: Any, x: Tensor, *rest: Any) -> Tensor:
    return reshape(cv, x, cv.out_dims(), hint=node.name)


@handles("_to_copy.default", "to.dtype", "_to_copy", "convert_element_type.default")
def _to_copy(cv: Any, node: Any, x: Tensor, *rest: Any, **kw: Any) -> Tensor:
    return cast(cv, x, cv.out_dtype())


@handles("prims::convert_element_type.default")
def _convert(cv: Any, node: Any, x: Tensor, dtype: Any) -> Tensor:
    return cast(cv, x, cv.out_dtype())


@handles("copy.default")
def _copy(cv: Any, node: Any, dst: Tensor, src: Tensor, non_blocking: bool = False) -> Tensor:
    s = cast(cv, src, cv.out_dtype())
    return _expand_to(cv, s, cv.out_dims(), node.name)


def _expand_to(cv: Any, x: Tensor, dims: tuple, hint: str | None) -> Tensor:
    if cv.shape_of(x) == tuple(dims):
        return x
    out = cv.em.node("Expand", [x, cv.em.shape_tensor(dims)], hint=hint, shape=dims, dtype=cv.dtype_of(x))
    cv.expanded[out.name] = x
    return out


@handles("expand.default", "expand_copy.default")
def _expand(cv: Any, node: Any, x: Tensor, sizes: Any, implicit: bool = False) -> Tensor:
    return _expand_to(cv, x, cv.out_dims(), node.name)


@handles("permute.default", "permute_copy.default")
def _permute(cv: Any, node: Any, x: Tensor, dims: list) -> Tensor:
    rank = len(cv.shape_of(x))
    perm = [axis(static_int(d, "a permutation"), rank) for d in dims]
    return _transpose(cv, x, perm, node.name)


def _transpose(cv: Any, x: Tensor, perm: list[int], hint: str | None) -> Tensor:
    if perm == list(range(len(perm))):
        return x
    prev = cv.transposed.get(x.name)
    if prev is not None:  # a permutation of a permutation: identity -> the first input, else keep both
        src, p0 = prev
        composed = [p0[i] for i in perm]
        if composed == list(range(len(perm))):
            return src
    out = cv.em.node("Transpose", [x], {"perm": perm}, hint=hint,
                     shape=tuple(cv.shape_of(x)[i] for i in perm), dtype=cv.dtype_of(x))
    cv.transposed[out.name] = (x, perm)
    return out


@handles("t.default", "numpy_T.default")
def _t(cv: Any, node: Any, x: Tensor) -> Tensor:
    rank = len(cv.shape_of(x))
    return _transpose(cv, x, list(range(rank))[::-1], node.name) if rank == 2 else x


@handles("transpose.int")
def _transpose_int(cv: Any, node: Any, x: Tensor, a: int, b: int) -> Tensor:
    rank = len(cv.shape_of(x))
    perm = list(range(rank))
    a, b = axis(a, rank), axis(b, rank)
    perm[a], perm[b] = perm[b], perm[a]
    return _transpose(cv, x, perm, node.name)


@handles("unsqueeze.default", "unsqueeze_copy.default")
def _unsqueeze(cv: Any, node: Any, x: Tensor, dim: int) -> Tensor:
    ax = axis(dim, len(cv.shape_of(x)) + 1)
    c = cv.em.const_value(x)
    if c is not None and c.size <= 1 << 16:
        return cv.em.const(np.expand_dims(c, ax), key=("unsq", cv.em.key[x.name], ax))
    src, axes = cv.unsqueezed.get(x.name, (x, []))
    axes = sorted([a + 1 if a >= ax else a for a in axes] + [ax])  # positions in the result, as ONNX takes them
    out = cv.em.node("Unsqueeze", [src, cv.em.ints(axes)], hint=node.name)
    cv.unsqueezed[out.name] = (src, axes)  # an unsqueeze of this becomes one node with both axes
    return out


@handles("squeeze.dim", "squeeze.dims", "squeeze.default", "squeeze_copy.dim", "squeeze_copy.dims")
def _squeeze(cv: Any, node: Any, x: Tensor, dims: Any = None) -> Tensor:
    shape = cv.shape_of(x)
    out = cv.out_dims()
    if len(out) == len(shape):
        return x
    if dims is None:
        axes = [i for i, d in enumerate(shape) if isinstance(d, int) and d == 1]
    else:
        dims = [dims] if isinstance(dims, int) else list(dims)
        axes = sorted(axis(d, len(shape)) for d in dims)
        axes = [a for a in axes if isinstance(shape[a], int) and shape[a] == 1]
    if len(shape) - len(axes) != len(out):
        raise Unsupported("squeeze of a dim torch could not decide is 1")
    return cv.em.node("Squeeze", [x, cv.em.ints(axes)], hint=node.name)


@handles("slice.Tensor", "slice_copy.Tensor")
def _slice(cv: Any, node: Any, x: Tensor, dim: int = 0, start: Any = None, end: Any = None, step: Any = 1) -> Tensor:
    shape = cv.shape_of(x)
    ax = axis(dim, len(shape))
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    if start == 0 and step == 1 and (end == INT64_MAX or (isinstance(end, int) and isinstance(shape[ax], int)
                                                          and end >= shape[ax]) or end == shape[ax]):
        return x
    if cv.out_dims() == shape and step == 1 and start == 0:
        return x
    em = cv.em
    ins = [x, em.dim(start), em.dim(min(end, INT64_MAX) if isinstance(end, int) else end), em.ints([ax])]
    if step != 1:
        ins.append(em.dim(step))
    return em.node("Slice", ins, hint=node.name)


@handles("narrow.default")
def _narrow(cv: Any, node: Any, x: Tensor, dim: int, start: Any, length: Any) -> Tensor:
    return _slice(cv, node, x, dim, start, start + length)


@handles("select.int", "select_copy.int")
def _select(cv: Any, node: Any, x: Tensor, dim: int, index: Any) -> Tensor:
    ax = axis(dim, len(cv.shape_of(x)))
    return cv.em.node("Gather", [x, tensor_of(cv, index, np.int64)], {"axis": ax}, hint=node.name)


@handles("index_select.default")
def _index_select(cv: Any, node: Any, x: Tensor, dim: int, idx: Tensor) -> Tensor:
    ax = axis(dim, len(cv.shape_of(x)))
    return cv.em.node("Gather", [x, cast(cv, idx, np.int64)], {"axis": ax}, hint=node.name)


@handles("gather.default")
def _gather(cv: Any, node: Any, x: Tensor, dim: int, idx: Tensor, sparse_grad: bool = False) -> Tensor:
    ax = axis(dim, len(cv.shape_of(x)))
    return cv.em.node("GatherElements", [x, cast(cv, idx, np.int64)], {"axis": ax}, hint=node.name)


@handles("index.Tensor", "_unsafe_index.Tensor")
def _index(cv: Any, node: Any, x: Tensor, indices: list) -> Tensor:
    """x[i0, i1, ...] (advanced indexing). One index tensor: Gather on its axis. Several, on leading axes:
    broadcast, stacked on a last axis, GatherND (torch.onnx's lowering). Other layouts are not supported."""
    em = cv.em
    given = [(k, t) for k, t in enumerate(indices) if t is not None]
    if not given:
        return x
    if len(given) == 1:
        k, t = given[0]
        if cv.dtype_of(t) == np.bool_:
            raise Unsupported("boolean mask indexing (data-dependent size)")
        return em.node("Gather", [x, cast(cv, t, np.int64)], {"axis": k}, hint=node.name)
    ks = [k for k, _ in given]
    if ks != list(range(len(ks))):
        raise Unsupported("advanced indexing with index tensors that are not the leading dims")
    from dynshape.shape import broadcast_shapes

    shapes = [cv.shape_of(t) for _, t in given]
    try:
        common = tuple(broadcast_shapes(*shapes))
    except Exception as e:
        raise Unsupported(f"index tensors whose shapes torch broadcasts but dynshape cannot decide ({e})") from None
    parts = []
    for _, t in given:
        t = _expand_to(cv, cast(cv, t, np.int64), common, None)
        parts.append(em.node("Unsqueeze", [t, em.ints([len(common)])], shape=(*common, 1), dtype=np.int64))
    idx = em.node("Concat", parts, {"axis": -1}, shape=(*common, len(parts)), dtype=np.int64)
    return em.node("GatherND", [x, idx], {"batch_dims": 0}, hint=node.name)


@handles("cat.default", "concat.default")
def _cat(cv: Any, node: Any, tensors: list, dim: int = 0) -> Tensor:
    kept = [t for t in tensors if not (len(cv.shape_of(t)) == 1 and cv.shape_of(t)[0] == 0)]  # legacy empty
    if not kept:
        return tensors[0]
    if len(kept) == 1:
        return kept[0]
    out = cv.out_dtype()
    ax = axis(dim, len(cv.shape_of(kept[0])))
    return cv.em.node("Concat", [cast(cv, t, out) for t in kept], {"axis": ax}, hint=node.name)


@handles("split_with_sizes.default", "split.Tensor", "split_with_sizes_copy.default", "split_copy.Tensor")
def _split(cv: Any, node: Any, x: Tensor, sizes: Any, dim: int = 0) -> list:
    ax = axis(dim, len(cv.shape_of(x)))
    fakes = cv.meta(node)
    lens = [cv.dims(f)[ax] for f in fakes]
    if len(lens) == 1:
        return [x]
    outs = cv.em.node("Split", [x, cv.em.shape_tensor(tuple(lens))], {"axis": ax}, n_out=len(lens),
                      hint=node.name, shapes=[cv.dims(f) for f in fakes], dtypes=[cv.dtype_of(x)] * len(lens))
    return list(outs)


@handles("unbind.int", "unbind_copy.int")
def _unbind(cv: Any, node: Any, x: Tensor, dim: int = 0) -> list:
    shape = cv.shape_of(x)
    ax = axis(dim, len(shape))
    n = static_int(shape[ax], "the length of an unbound dim")
    fakes = cv.meta(node)
    outs = []
    for i in range(n):
        outs.append(cv.em.node("Gather", [x, cv.em.const(np.array(i, np.int64))], {"axis": ax},
                               shape=cv.dims(fakes[i]), dtype=cv.dtype_of(x)))
    return outs


@handles("flip.default")
def _flip(cv: Any, node: Any, x: Tensor, dims: list) -> Tensor:
    rank = len(cv.shape_of(x))
    axes = [axis(d, rank) for d in dims]
    em = cv.em
    n = len(axes)
    return em.node("Slice", [x, em.ints([-1] * n), em.ints([-INT64_MAX] * n), em.ints(axes), em.ints([-1] * n)],
                   hint=node.name)


@handles("roll.default")
def _roll(cv: Any, node: Any, x: Tensor, shifts: list, dims: list = ()) -> Tensor:
    """roll along fixed-length dims: Concat(x[n-k:], x[:n-k]) (a symbolic length would need k mod n)."""
    if not dims:
        raise Unsupported("roll without dims (over the flattened tensor)")
    y, em = x, cv.em
    for s, d in zip(shifts, dims):
        shape = cv.shape_of(y)
        ax = axis(d, len(shape))
        n = static_int(shape[ax], "the length of a rolled dim")
        k = static_int(s, "a roll shift") % n if n else 0
        if k == 0:
            continue
        a = em.node("Slice", [y, em.ints([n - k]), em.ints([n]), em.ints([ax])], dtype=cv.dtype_of(y))
        b = em.node("Slice", [y, em.ints([0]), em.ints([n - k]), em.ints([ax])], dtype=cv.dtype_of(y))
        y = em.node("Concat", [a, b], {"axis": ax}, shape=shape, dtype=cv.dtype_of(y))
    return y


@handles("repeat.default")
def _repeat(cv: Any, node: Any, x: Tensor, repeats: list) -> Tensor:
    rank = len(cv.shape_of(x))
    if len(repeats) > rank:
        extra = len(repeats) - rank
        x = cv.em.node("Unsqueeze", [x, cv.em.ints(list(range(extra)))],
                       shape=(1,) * extra + cv.shape_of(x), dtype=cv.dtype_of(x))
    return cv.em.node("Tile", [x, cv.em.shape_tensor(tuple(repeats))], hint=node.name)


@handles("constant_pad_nd.default")
def _pad(cv: Any, node: Any, x: Tensor, pad: list, value: Any = 0) -> Tensor:
    rank = len(cv.shape_of(x))
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        ax = rank - 1 - i
        begins[ax], ends[ax] = pad[2 * i], pad[2 * i + 1]
    dt = cv.dtype_of(x)
    return cv.em.node("Pad", [x, cv.em.shape_tensor(tuple(begins + ends)), tensor_of(cv, value, dt)],
                      {"mode": "constant"}, hint=node.name)


@handles("reflection_pad1d.default", "reflection_pad2d.default", "reflection_pad3d.default",
         "replication_pad1d.default", "replication_pad2d.default", "replication_pad3d.default")
def _pad_mode(cv: Any, node: Any, x: Tensor, pad: list) -> Tensor:
    rank = len(cv.shape_of(x))
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        ax = rank - 1 - i
        begins[ax], ends[ax] = pad[2 * i], pad[2 * i + 1]
    mode = "reflect" if node.target.__name__.startswith("reflection") else "edge"
    return cv.em.node("Pad", [x, cv.em.shape_tensor(tuple(begins + ends))], {"mode": mode}, hint=node.name)


@handles("tril.default", "triu.default")
def _tril(cv: Any, node: Any, x: Tensor, diagonal: Any = 0) -> Tensor:
    upper = int(node.target.__name__.startswith("triu"))
    return cv.em.node("Trilu", [x, tensor_of(cv, diagonal, np.int64)], {"upper": upper}, hint=node.name)


@handles("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(cv: Any, node: Any, x: Tensor, mask: Tensor, value: Any) -> Tensor:
    dt = cv.out_dtype()
    return cv.em.node("Where", [cast(cv, mask, np.bool_), tensor_of(cv, value, dt), x], hint=node.name)


@handles("topk.default")
def _topk(cv: Any, node: Any, x: Tensor, k: Any, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple:
    ax = axis(dim, len(cv.shape_of(x)))
    v, i = cv.em.node("TopK", [x, cv.em.dim(k)], {"axis": ax, "largest": int(largest), "sorted": int(sorted)},
                      n_out=2, hint=node.name, shapes=[cv.out_dims(index=0), cv.out_dims(index=1)],
                      dtypes=[cv.dtype_of(x), np.int64])
    return (v, i)


# ---- factories -------------------------------------------------------------------------------------------
def _filled(cv: Any, node: Any, dims: tuple, value: Any) -> Tensor:
    dt = cv.out_dtype()
    scalar = tensor_of(cv, value, dt)
    if not dims:
        return scalar
    c = cv.em.const_value(scalar)
    if c is not None and all(isinstance(d, int) for d in dims) and int(np.prod(dims)) <= 1 << 16:
        return cv.em.const(np.full(dims, c, dt))
    return cv.em.node("Expand", [scalar, cv.em.shape_tensor(dims)], hint=node.name, shape=dims, dtype=dt)


@handles("full.default", "new_full.default")
def _full(cv: Any, node: Any, *args: Any, **kw: Any) -> Tensor:
    value = args[-1] if len(args) >= 2 else kw.get("fill_value")
    return _filled(cv, node, cv.out_dims(), value)


@handles("zeros.default", "new_zeros.default", "empty.memory_format", "new_empty.default", "zeros_like.default",
         "empty_like.default", "empty_strided.default", "new_empty_strided.default")
def _zeros(cv: Any, node: Any, *args: Any, **kw: Any) -> Tensor:
    return _filled(cv, node, cv.out_dims(), 0)


@handles("ones.default", "new_ones.default", "ones_like.default")
def _ones(cv: Any, node: Any, *args: Any, **kw: Any) -> Tensor:
    return _filled(cv, node, cv.out_dims(), 1)


@handles("full_like.default")
def _full_like(cv: Any, node: Any, x: Tensor, value: Any, **kw: Any) -> Tensor:
    return _filled(cv, node, cv.out_dims(), value)


@handles("fill.Scalar", "fill.Tensor")
def _fill(cv: Any, node: Any, x: Tensor, value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return _expand_to(cv, cast(cv, value, cv.out_dtype()), cv.out_dims(), node.name)
    return _filled(cv, node, cv.out_dims(), value)


@handles("scalar_tensor.default")
def _scalar_tensor(cv: Any, node: Any, value: Any, **kw: Any) -> Tensor:
    return tensor_of(cv, value, cv.out_dtype())


@handles("lift_fresh.default")
def _lift(cv: Any, node: Any, x: Tensor) -> Tensor:
    return x


@handles("arange.start_step", "arange.default", "arange.start")
def _arange(cv: Any, node: Any, *args: Any, **kw: Any) -> Tensor:
    name = node.target.__name__
    nums = [a for a in args if isinstance(a, (int, float)) or is_expr(a)]
    start, step = 0, 1
    if name == "arange.default":
        (end,) = nums[:1]
    elif name == "arange.start":
        start, end = nums[:2]
    else:
        start, end = nums[:2]
        step = nums[2] if len(nums) > 2 else kw.get("step", 1)
    dt = cv.out_dtype()
    em = cv.em
    r = em.node("Range", [tensor_of(cv, start, dt), tensor_of(cv, end, dt), tensor_of(cv, step, dt)],
                hint=node.name, shape=cv.out_dims(), dtype=dt)
    return r
