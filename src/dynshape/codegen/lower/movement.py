"""Native lowerings of data movement and indexing: what a plan binds once per key, so the call is one copy.

Transpose, Expand, Cast, Slice and Gather of one index: the source view is fixed for the key, so the call is one
strided copy in C
(`ds_copy_strided`, csrc/ds_program.c: it joins the plan's program of native calls) or one np.copyto; one index
fed at run time (a Loop body's xs[i]) is checked and its row copied when the call runs. Other Gathers check their
indices and take into the planned buffer; GatherND whose indices are fixed for the key (built from
shapes) gets its flat positions computed and bounds-checked once, so the call is one np.take. Concat copies each
input's rows into place (one C call for all of them). A constant Pad fills its output and copies the input into
the interior. Split copies each output's view of the input (a strided copy each). GatherElements gathers in C and
raises, naming the node, when an index was out of range (never read).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from dynshape.codegen import program
from dynshape.codegen.keep import Keep
from dynshape.codegen.lowering import BindRequest, NativeCall, NativeRule, RetableRequest, register_lowering
from dynshape.errors import ConstraintViolation, DynshapeError
from dynshape.ir import opdef
from dynshape.ir.graph import Graph, Node
from dynshape.sym.trace import Traced, untraced

_PLAIN = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
          "float64"}


def _one_output(node: Node, graph: Graph) -> str | None:
    return None if len([o for o in node.outputs if o]) == 1 else "more than one output"


def _copy(src: np.ndarray, out: np.ndarray, keep: Keep) -> list | None:
    """out[...] = src as one call: the C strided copy (same dtype), else np.copyto."""
    if src.shape != out.shape:
        return None
    lib = program.LIBRARY.try_load()
    if lib is not None and src.dtype == out.dtype and out.flags.c_contiguous and src.ndim <= 16:
        shape, strides = _merged(src.shape, src.strides)
        groups = shape[2] if _is_shuffle(shape, strides, src.itemsize) else 0
        table = None if groups else _row_table(shape, strides, src.itemsize)
        if groups or table is not None:  # one entry point for both: keys of a bucket plan may take either
            width = math.prod(shape[1:])
            desc = keep.table([out.ctypes.data, src.ctypes.data, shape[0], strides[0], width,
                               0 if table is None else table.ctypes.data, groups])
            keep.hold(src)
            if table is not None:
                keep.append(table)
            return [NativeCall(lib.ds_permute_rows, (desc,))]
        desc = keep.table(_strided_desc(shape, strides, src.itemsize, out.ctypes.data, src.ctypes.data))
        keep.hold(src)
        return [NativeCall(lib.ds_copy_strided, (desc,))]
    return [functools.partial(np.copyto, out, src, casting="unsafe")]


def _strided_desc(shape: list[int], strides: list[int], itemsize: int, out_addr: int, src_addr: int) -> list[int]:
    """ds_copy_strided's table for a merged view (`_merged`) copied into a contiguous output."""
    return [len(shape), itemsize, out_addr, src_addr, *shape, *strides]


def _retable_copy(r: RetableRequest, src_strides: list[int] | None) -> list | None:
    """The words of a `_copy` that made one ds_copy_strided call, for a source of the output's shape read with
    `src_strides` (bytes) at the request's first input address; None where `_copy` would take another path at this
    key (the row-permute entry point, a table of offsets) or made another call at the last one."""
    lib = program.LIBRARY.try_load()
    if src_strides is None or lib is None or r.fns != (lib.ds_copy_strided,) or r.in_addrs[0] is None \
            or r.out_addrs[0] is None or len(src_strides) > 16:
        return None
    shape, strides = _merged(r.out_shapes[0], src_strides)
    if _is_shuffle(shape, strides, r.itemsize) or _row_table(shape, strides, r.itemsize) is not None:
        return None
    return [_strided_desc(shape, strides, r.itemsize, r.out_addrs[0], r.in_addrs[0])]


def _symbolic(*dims: Any) -> bool:
    """Whether a dim is traced (sym/trace.py: a bucket plan tracing a retable into the key's compiled function)."""
    return any(isinstance(d, Traced) for d in dims)


def _same(a: Any, b: Any) -> bool:
    """a == b for ints; for traced dims, whether they are the same expression, so equal at every key (different
    ones count as unequal: the callers only ever skip an optimisation on that answer, or refuse)."""
    return untraced(a) == untraced(b) if _symbolic(a, b) else a == b


def _contiguous_strides(shape: tuple, itemsize: int) -> list[int] | None:
    """A C-contiguous array's strides in bytes, as numpy gives them; None where a dim is 0 (numpy's strides of an
    empty array are its own business: the binder decides). A traced dim may be 0 at some key: the copy then moves
    nothing (ds_copy_strided returns at a zero dim), whatever the strides say."""
    if any(not _symbolic(d) and d == 0 for d in shape):
        return None
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= d
    return out[::-1]


def _merged(shape: tuple, strides: tuple) -> tuple[list[int], list[int]]:
    """The same strided view with adjacent dims merged where the outer one steps over the inner one whole (the
    destination is contiguous, so its dims merge alike): a channels-last shuffle's (N, H, W, g, c) reads as
    (N * H * W, g, c), and the copy's index arithmetic per outer position shrinks with the rank."""
    # a length-1 dim moves nothing (a traced dim is kept: where it is 1, its stride is never stepped)
    dims = [(n if _symbolic(n) else int(n), st if _symbolic(st) else int(st))
            for n, st in zip(shape, strides) if _symbolic(n) or n != 1]
    if not dims:
        return [1] * min(1, len(shape)), [0] * min(1, len(shape))
    out_shape, out_strides = [dims[0][0]], [dims[0][1]]
    for n, st in dims[1:]:
        if _same(out_strides[-1], n * st):
            out_shape[-1] *= n
            out_strides[-1] = st
        else:
            out_shape.append(n)
            out_strides.append(st)
    return out_shape, out_strides


SHUFFLE_GROUPS = (2, 4, 8)  # the (G, n) -> (n, G) transposes ds_permute_rows interleaves in registers


def _is_shuffle(shape: list[int], strides: list[int], itemsize: int) -> bool:
    """A view (rows, n, G) of 4-byte elements reading each row's (G, n) block transposed: a channels-last
    channel shuffle (ShuffleNet's groups), moved by ds_permute_rows without a table (csrc's ds_shuffle_rows).
    Never for traced dims (the strided copy is right at every key)."""
    return not _symbolic(*shape, *strides) and itemsize == 4 and len(shape) == 3 and shape[2] in SHUFFLE_GROUPS \
        and strides[1] == 4 and strides[2] == 4 * shape[1] and strides[0] % 4 == 0


ROW_TABLE_MAX = 1024  # elements of the inner block moved by one table (ds_permute_rows)
# Contiguous runs shorter than this still take the table: the strided copy's per-run index arithmetic and memcpy
# cost more than the run (MobileViT's unfold, (1536, 2, 12, 2) -> (1536, 12, 2, 2): runs of 2, 2.6 ns an element).
SHORT_RUN = 16


def _row_table(shape: list[int], strides: list[int], itemsize: int) -> np.ndarray | None:
    """For a view (rows, *inner) of 4-byte elements whose inner block is small and not contiguous, or contiguous
    in short runs only (a transpose of inner dims per row), the block's source offsets in elements, in
    destination order; else None."""
    if _symbolic(*shape, *strides):  # (traced: the strided copy, right at every key)
        return None
    contiguous_runs = strides[-1] == itemsize and shape[-1] >= SHORT_RUN
    if itemsize != 4 or len(shape) < 3 or contiguous_runs or any(st % 4 for st in strides[1:]) \
            or math.prod(shape[1:]) > ROW_TABLE_MAX or shape[0] == 0:
        return None
    grid = np.indices(shape[1:], dtype=np.int64).reshape(len(shape) - 1, -1)
    offsets = (grid * np.array([st // 4 for st in strides[1:]], np.int64)[:, None]).sum(axis=0)
    if offsets.min() < 0 or offsets.max() >= 1 << 31:
        return None
    return np.ascontiguousarray(offsets, dtype=np.int32)


def _bind_transpose(r: BindRequest) -> list | None:
    x, out = r.ins[0], r.outs[0]
    perm = r.attrs.get("perm")
    return _copy(x.transpose(perm) if perm is not None else x.T, out, r.keep)


def _bind_expand(r: BindRequest) -> list | None:
    x, out = r.ins[0], r.outs[0]
    if x.dtype != out.dtype:
        return None
    try:
        src = np.broadcast_to(x, out.shape)
    except ValueError:
        return None
    return _copy(src, out, r.keep)


def _retable_expand(r: RetableRequest) -> list | None:
    """`_bind_expand`'s words from the shapes: the input broadcast to the output's shape (stride 0 on the dims it
    repeats), as np.broadcast_to strides it. Why: Llama's key / value heads repeated for its query heads are four
    Expands of the growing cache a step, each bound again at every new past length (~25 us each)."""
    x, out = r.in_shapes[0], r.out_shapes[0]
    strides = _contiguous_strides(x, r.itemsize) if x is not None and out is not None and len(x) <= len(out) \
        else None
    if strides is None:
        return None
    lead = len(out) - len(x)
    src = [0] * lead
    for d, n, st in zip(x, out[lead:], strides):
        if _same(d, n):
            src.append(st)
        elif not _symbolic(d) and d == 1:
            src.append(0)
        else:
            return None  # not broadcastable (or not known to be at every key): bind again (the numpy path raises)
    return _retable_copy(r, src)


def _cast_accepts(node: Node, graph: Graph) -> str | None:
    a, b = (np.dtype(graph.types[v].dtype) for v in (node.inputs[0], node.outputs[0]))
    if a.name not in _PLAIN or b.name not in _PLAIN:
        return f"Cast {a} -> {b} (ml_dtypes formats keep the reference's rounding)"
    if a.kind == "f" and b.kind in "iub":
        return f"Cast {a} -> {b} (float to integer follows ONNX, not numpy's conversion)"
    return _one_output(node, graph)


def _bind_cast(r: BindRequest) -> list | None:
    return _copy(r.ins[0], r.outs[0], r.keep)


def _gather_accepts(node: Node, graph: Graph) -> str | None:
    x, idx = graph.types.get(node.inputs[0]), graph.types.get(node.inputs[1])
    if not getattr(x, "shape", ()) or np.dtype(idx.dtype).kind not in "iu":
        return "scalar data, or non-integer indices"
    return _one_output(node, graph)


def _gather_table(out_addr: int, x_addr: int, idx_addr: int, idx_int32: bool, x_shape: tuple, axis: int,
                  itemsize: int, count: int, status: bool = False) -> list[int]:
    """ds_gather_rows' / ds_gather_pick's table: the output, the data, the indices and whether they are int32, the
    data's rows before the axis, its length, the bytes after it, and the index count (0: one index, picked);
    `status`: ds_gather_rows_st's two more words (GATHER_STATUS: the count refused, then the first one)."""
    return [out_addr, x_addr, idx_addr, int(idx_int32), math.prod(x_shape[:axis]), x_shape[axis],
            math.prod(x_shape[axis + 1:]) * itemsize, count, *((0, 0) if status else ())]


GATHER_STATUS = 8  # ds_gather_rows_st's status word: the count of indices out of range (9: the first)


def _gather_refused(label: str, axis: int, words: Any, bad: int) -> None:
    """A run-time Gather's refusal from its table's words (read after the call: a bucket plan moved to another key
    rewrote them): numpy's IndexError wording for the first index out of range, which the call kept (word 9)."""
    n = words[5]
    raise ConstraintViolation(f"{label}: index {words[9]} is out of bounds for axis {axis} with size {n} ({bad} of "
                              f"the indices are out of range [-{n}, {n}))")


def _out_of_range(idx: np.ndarray, n: int) -> bool:
    """Whether an index lies outside [-n, n), ONNX's admissible range for an axis of length n."""
    return bool(idx.size) and (int(idx.min()) < -n or int(idx.max()) >= n)


def _bind_gather(r: BindRequest) -> list | None:
    x, idx, out = r.ins[0], r.ins[1], r.outs[0]
    axis = r.attrs.get("axis", 0)
    axis = axis + x.ndim if axis < 0 else axis
    n = x.shape[axis]
    lib = program.LIBRARY.try_load()
    if lib is not None and out is not None and 0 <= axis < x.ndim and isinstance(idx, np.ndarray) \
            and idx.dtype.name in ("int32", "int64") and x.dtype == out.dtype and idx.flags.c_contiguous \
            and x.flags.c_contiguous and out.flags.c_contiguous and out.shape == (*x.shape[:axis], *idx.shape,
                                                                                  *x.shape[axis + 1:]):
        # one C call over the indices (csrc/ds_program.c): out-of-range ones are counted, not read, and refused
        # naming the first such index and the node (here where the indices are known, else by the plan after it)
        at = (r.addr(out), r.addr(x), r.addr(idx), idx.dtype == np.int32)
        if _fixed_params(r):  # indices known for the key (a causal mask's positions): checked now, and the call
            if _out_of_range(idx, n):  # joins the plan's program (no Python call, and
                np.take(x, idx, axis=axis)  # a bucket plan moved to another key rewrites its table in place)
            return [NativeCall(lib.ds_gather_rows, (r.keep.table(_gather_table(*at, x.shape, axis, x.itemsize,
                                                                               idx.size)),))]
        # indices read at run time (token ids): the call joins the program too, and sets its status word (the
        # table's 9th) to the count of indices out of range, which the plan checks after its calls
        desc = r.keep.table(_gather_table(*at, x.shape, axis, x.itemsize, idx.size, status=True))
        r.keep.check(desc, GATHER_STATUS, functools.partial(_gather_refused, r.node.label(), axis))
        return [NativeCall(lib.ds_gather_rows_st, (desc,))]

    def gather() -> None:
        # mode="raise" copies through a temporary buffer (3x slower on bert's embeddings): the indices are
        # checked here, then "wrap" maps the admissible negative ones as ONNX does (-1 is the last)
        if _out_of_range(idx, n):
            np.take(x, idx, axis=axis)  # raises the out-of-range error, names the index
        np.take(x, idx, axis=axis, out=out, mode="wrap")

    return [gather]


def _bind_gather_nd(r: BindRequest) -> list | None:
    if len(r.ins) != 2 or r.node.inputs[1] not in r.fixed or r.outs[0] is None:
        return None
    x, idx = r.ins
    b = int(r.attrs.get("batch_dims", 0))
    k = idx.shape[-1]
    dims = np.array(x.shape[b:b + k], dtype=np.int64)
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + dims, idx)
    if ((idx < 0) | (idx >= dims)).any():
        raise DynshapeError(f"{r.node.label()}: an index is out of range for data of shape {x.shape}")
    nb, inner = math.prod(x.shape[:b]), math.prod(x.shape[b + k:])
    pos = np.ravel_multi_index(tuple(np.moveaxis(idx.reshape(nb, -1, k), -1, 0)), x.shape[b:b + k]) if k else \
        np.zeros((nb, 1), np.int64)
    pos = pos + (np.arange(nb)[:, None] * math.prod(x.shape[b:b + k]))
    flat = (pos[..., None] * inner + np.arange(inner)).reshape(-1)
    src, dst = x.reshape(-1), r.outs[0].reshape(-1)
    if dst.size != flat.size:
        return None
    return [functools.partial(np.take, src, flat, out=dst, mode="clip")]


def _concat_accepts(node: Node, graph: Graph) -> str | None:
    types = [graph.types.get(x) for x in (*node.inputs, node.outputs[0])]
    if any(getattr(t, "shape", None) is None for t in types) or len({np.dtype(t.dtype) for t in types}) != 1:
        return "inputs of different dtypes, or not tensors"
    return None


def _bind_concat(r: BindRequest) -> list | None:
    """Every input's rows copied into place in one C call (numpy's concatenate allocates a new array)."""
    out = r.outs[0]
    lib = program.LIBRARY.try_load()
    if lib is None or out is None or not out.flags.c_contiguous or any(x is None for x in r.ins):
        return None
    axis = int(r.attrs.get("axis", 0)) % out.ndim
    inner = math.prod(out.shape[axis + 1:]) * out.itemsize
    srcs, col = [], 0
    for x in r.ins:  # an input already at its columns of the output (a partial join) stays where it is
        at_home = x.size > 0 and r.addr(x) == r.addr(out) + col
        srcs.append(x if at_home else np.ascontiguousarray(x))
        col += x.shape[axis] * inner
    desc = _concat_desc(axis, out.shape, out.itemsize, r.addr(out), [x.shape for x in srcs],
                        [r.addr(x) for x in srcs])
    for x in srcs:
        r.keep.hold(x)
    return [NativeCall(lib.ds_concat, (r.keep.table(desc),))]


def _concat_desc(axis: int, out_shape: tuple, itemsize: int, out_addr: int, in_shapes: list,
                 in_addrs: list) -> list[int]:
    """ds_concat's table: the output, its rows, the inputs' count and the bytes of an output row, then each
    input's address and the bytes of its row."""
    axis %= len(out_shape)
    inner = math.prod(out_shape[axis + 1:]) * itemsize
    desc = [out_addr, math.prod(out_shape[:axis]), len(in_shapes), out_shape[axis] * inner]
    for shape, at in zip(in_shapes, in_addrs):
        desc += [at, shape[axis] * inner]
    return desc


def _retable_concat(r: RetableRequest) -> list | None:
    if any(x is None for x in (*r.in_shapes, *r.in_addrs)):
        return None
    return [_concat_desc(int(r.attrs.get("axis", 0)), r.out_shapes[0], r.itemsize, r.out_addrs[0], r.in_shapes,
                         r.in_addrs)]


def _fixed_params(r: BindRequest) -> bool:
    """Every input after the data is known for this key (a constant, or computed from shapes)."""
    return all(not x or x in r.fixed for x in r.node.inputs[1:])


def _bind_slice(r: BindRequest) -> list | None:
    """The reference slices with basic indexing: on the planned input it returns a view, copied in one call."""
    x, out = r.ins[0], r.outs[0]
    if out is None or not _fixed_params(r):
        return None
    view = opdef.lookup("Slice").reference([x, *r.ins[1:]], r.attrs)[0]
    if view.shape != out.shape or not (view.size == 0 or np.shares_memory(view, x)):
        return None
    return _copy(view, out, r.keep)


def _bind_gather_one(r: BindRequest) -> list | None:
    """Gather of one index fixed for the key (torch's select): a view of the input, copied in one call."""
    x, out = r.ins[0], r.outs[0]
    if out is None or not _fixed_params(r):
        return None
    axis = int(r.attrs.get("axis", 0)) % x.ndim
    i = int(r.ins[1])
    if not -x.shape[axis] <= i < x.shape[axis]:
        return None  # the numpy path raises the reference's error
    return _copy(x[(slice(None),) * axis + (i % x.shape[axis],)], out, r.keep)


def _bind_gather_picked(r: BindRequest) -> list | None:
    """Gather of one index read at run time (a Loop body's xs[i]): the index checked, its view copied. Why not
    np.take: its checks and dispatch cost ~2.5 us a call, most of a small body's iteration."""
    x, idx, out = r.ins[0], r.ins[1], r.outs[0]
    if out is None or x is None or idx is None:
        return None
    axis = int(r.attrs.get("axis", 0)) % x.ndim
    n, lead = x.shape[axis], (slice(None),) * axis

    def pick() -> None:
        i = int(idx)
        if not -n <= i < n:
            np.take(x, idx, axis=axis)  # raises the out-of-range error, names the index
        out[...] = x[(*lead, i)]

    lib = program.LIBRARY.try_load()
    if (lib is not None and isinstance(idx, np.ndarray) and idx.dtype in (np.int32, np.int64)
            and x.flags.c_contiguous and out.flags.c_contiguous):
        # the same step in C, for a loop driver running the body's iterations in one call (runtime/loop_driver.py;
        # it checks the status word a[7]): `pick` stays the plan's own call, which raises by name
        table = r.keep.table(_gather_table(r.addr(out), r.addr(x), r.addr(idx), idx.dtype == np.int32, x.shape, axis,
                                           x.itemsize, 0))
        pick.native = (lib.ds_gather_pick, table)  # type: ignore[attr-defined]
    return [pick]


def _retable_gather(r: RetableRequest) -> list | None:
    """`_bind_gather`'s table at another key, from the shapes and addresses. Indices known for the key (a causal
    mask's positions, per-key values of a decode step's past length) are range-checked as the binder checks them
    (why: GPT-2's mask gather was bound again at every new past length, ~30 us a token). Indices read at run time
    (ds_gather_rows_st: checked by its call) need no check: the words are plain arithmetic (no comparison of dims),
    so a bucket plan traces them into the key's compiled function; the output's shape is the data's with the
    indices' in place of the axis, by inference, as the binder found it at the plan's key."""
    lib = program.LIBRARY.try_load()
    x = r.in_shapes[0]
    if lib is None or not x or any(a is None for a in (r.in_addrs[0], r.in_addrs[1], r.out_addrs[0])):
        return None
    axis = int(r.attrs.get("axis", 0))
    axis = axis + len(x) if axis < 0 else axis
    if not 0 <= axis < len(x):
        return None
    at = (r.out_addrs[0], r.in_addrs[0], r.in_addrs[1])
    if r.fns == (lib.ds_gather_rows_st,):
        ix, size = r.in_shapes[1], r.in_itemsizes[1] if len(r.in_itemsizes) > 1 else 0
        if ix is None or size not in (4, 8):
            return None
        return [_gather_table(*at, size == 4, x, axis, r.itemsize, math.prod(ix), status=True)]
    idx = r.in_values[1] if len(r.in_values) > 1 else None
    if r.fns != (lib.ds_gather_rows,) or not isinstance(idx, np.ndarray) or idx.ndim == 0 \
            or idx.dtype.type not in (np.int32, np.int64) or not idx.flags.c_contiguous \
            or r.out_shapes[0] != (*x[:axis], *idx.shape, *x[axis + 1:]):
        return None
    if _out_of_range(idx, x[axis]):
        return None  # bind again: it raises, naming the index
    return [_gather_table(*at, idx.dtype == np.int32, x, axis, r.itemsize, idx.size)]


def _gather_bind(r: BindRequest) -> list | None:
    if np.ndim(r.ins[1]) == 0:
        return _bind_gather_one(r) if _fixed_params(r) else _bind_gather_picked(r)
    return _bind_gather(r)


def _split_accepts(node: Node, graph: Graph) -> str | None:
    types = [graph.types.get(x) for x in (node.inputs[0], *node.outputs) if x]
    if any(getattr(t, "shape", None) is None for t in types) or len({np.dtype(t.dtype) for t in types}) != 1:
        return "outputs of another dtype than the input, or not tensors"
    return None


def _bind_split(r: BindRequest) -> list | None:
    """The sizes fixed for the key (an attribute, a constant or shape-derived input, or equal parts): the
    reference's np.split gives each output's view of the planned input, copied in one call each (gpt2's fused
    QKV projection, yolov8's C2f blocks)."""
    if not _fixed_params(r) or r.ins[0] is None:
        return None
    views = opdef.lookup("Split").reference(list(r.ins), r.attrs)
    if len(views) != len(r.outs):
        return None
    calls: list = []
    for view, out in zip(views, r.outs):
        if out is None:
            continue
        if not (view.size == 0 or np.shares_memory(view, r.ins[0])):
            return None
        made = _copy(view, out, r.keep)
        if made is None:
            return None
        calls += made
    return calls


def _gather_elements_accepts(node: Node, graph: Graph) -> str | None:
    x, idx, y = (graph.types.get(v) for v in (node.inputs[0], node.inputs[1], node.outputs[0]))
    if any(getattr(t, "shape", None) is None for t in (x, idx, y)) or np.dtype(x.dtype) != np.dtype(y.dtype):
        return "not tensors of one dtype"
    if np.dtype(idx.dtype).name not in ("int32", "int64") or np.dtype(x.dtype).name not in _PLAIN:
        return "indices not int32 / int64, or data of an unusual dtype"
    return None if 1 <= len(x.shape) <= 16 else "rank 0 or above 16"


def elements_axis(attrs: dict, data: tuple, indices: tuple) -> int | None:
    """The axis (>= 0) a GatherElements / ScatterElements takes, when its indices fit the data on every other axis
    (no larger there); None where the reference raises (an axis out of range, indices too long)."""
    axis = int(attrs.get("axis", 0))
    if not -len(data) <= axis < len(data):
        return None
    axis %= len(data)
    return None if any(i > d for k, (i, d) in enumerate(zip(indices, data)) if k != axis) else axis


def _bind_gather_elements(r: BindRequest) -> list | None:
    """One C call over the indices (csrc/ds_program.c): out-of-range ones are counted, not read, and the call
    raises with the node's name, as the reference's IndexError would."""
    lib = program.LIBRARY.try_load()
    x, idx, out = r.ins[0], r.ins[1], r.outs[0]
    if lib is None or out is None or x.ndim != idx.ndim or not 1 <= x.ndim <= 16 or out.shape != idx.shape \
            or not out.flags.c_contiguous or not idx.flags.c_contiguous or idx.dtype.name not in ("int32", "int64"):
        return None
    axis = elements_axis(r.attrs, x.shape, idx.shape)
    if axis is None:
        return None  # the reference's error
    n = x.shape[axis]
    desc = r.keep.table([x.ndim, axis, x.itemsize, int(idx.dtype == np.int32), r.addr(out), r.addr(x), r.addr(idx),
                         n, *idx.shape, *x.strides])
    fn, label = lib.ds_gather_elements, r.node.label()

    def gather() -> None:
        bad = fn(desc.addr)  # the table's address, known once the plan is sealed
        if bad:
            raise DynshapeError(f"{label}: {bad} of the indices are out of range [-{n}, {n}) for axis {axis} of data "
                                f"of shape {x.shape}")

    return [gather]


_PAD_MODES = ("constant", "edge", "reflect", "wrap")


def _pad_accepts(node: Node, graph: Graph) -> str | None:
    if node.attrs.get("mode", "constant") not in _PAD_MODES:
        return f"mode {node.attrs.get('mode')!r}"
    return _one_output(node, graph)


def _bind_pad(r: BindRequest) -> list | None:
    """Constant Pad: the output filled with the constant, then the (cropped) input copied into its interior.
    Edge / reflect / wrap: per padded axis, the source position of every output position, fixed for the key
    (np.pad of the positions themselves, so exactly the reference's rule), and one np.take along each such
    axis (a voice-activity model's reflect pad of 576 samples ran 30 us of a 62 us call on the reference)."""
    x, out = r.ins[0], r.outs[0]
    if out is None or not _fixed_params(r) or x.dtype != out.dtype:
        return None
    from dynshape.ops.movement import pad_args

    pads, value, axes = pad_args(r.ins, r.attrs)
    axes = list(range(x.ndim)) if axes is None else [int(a) % x.ndim for a in axes]
    width = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        width[a] = (int(pads[i]), int(pads[len(axes) + i]))
    src = x[tuple(slice(max(-b, 0), n - max(-e, 0)) for (b, e), n in zip(width, x.shape))]
    mode = r.attrs.get("mode", "constant")
    if mode != "constant":
        return _bind_pad_positions(src, out, [(max(b, 0), max(e, 0)) for b, e in width], mode, r.keep)
    dst = out[tuple(slice(max(b, 0), max(b, 0) + m) for (b, _), m in zip(width, src.shape))]
    if dst.shape != src.shape:
        return None
    fill = np.asarray(value).astype(out.dtype).item()
    return [functools.partial(out.fill, fill), functools.partial(np.copyto, dst, src)]


def _bind_pad_positions(src: np.ndarray, out: np.ndarray, grow: list, mode: str, keep: list) -> list | None:
    padded = [a for a, (b, e) in enumerate(grow) if b or e]
    if not padded:
        return [functools.partial(np.copyto, out, src)] if src.shape == out.shape else None
    try:  # an empty axis cannot be reflected: the reference raises the error the user should see
        where = {a: np.pad(np.arange(src.shape[a], dtype=np.intp), grow[a], mode=mode) for a in padded}
    except ValueError:
        return None
    calls, cur, shape = [], src, list(src.shape)
    for k, a in enumerate(padded):
        shape[a] = len(where[a])
        dst = out if k == len(padded) - 1 else np.empty(shape, out.dtype)
        if dst.shape != tuple(shape):
            return None
        keep.extend((where[a], dst))
        calls.append(functools.partial(np.take, cur, where[a], axis=a, out=dst, mode="clip"))
        cur = dst
    return calls


register_lowering("Transpose", "native", NativeRule(_one_output, _bind_transpose))
register_lowering("Concat", "native", NativeRule(_concat_accepts, _bind_concat, retable=_retable_concat))
register_lowering("Expand", "native", NativeRule(_one_output, _bind_expand, retable=_retable_expand,
                                                 params=lambda node: ()))  # (the shape: its output's)
register_lowering("Cast", "native", NativeRule(_cast_accepts, _bind_cast))
register_lowering("Gather", "native", NativeRule(_gather_accepts, _gather_bind, retable=_retable_gather))
register_lowering("GatherND", "native", NativeRule(_one_output, _bind_gather_nd))
register_lowering("Slice", "native", NativeRule(_one_output, _bind_slice))
register_lowering("Split", "native", NativeRule(_split_accepts, _bind_split))
register_lowering("GatherElements", "native", NativeRule(_gather_elements_accepts, _bind_gather_elements))
register_lowering("Pad", "native", NativeRule(_pad_accepts, _bind_pad))
