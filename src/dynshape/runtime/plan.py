"""Memory planning and pre-bound calls: the request path of a compiled executable.

For each distinct tuple of symbol values (the key) a `BoundPlan` is made once:
- every tensor's shape is evaluated, buffers get offsets in one arena by first-fit over their lifetimes
  (views such as Reshape share their producer's buffer and extend its lifetime);
- every C kernel (fused groups, GEMM, softmax, layer norm) gets its argument tuple with final addresses,
  so running it is one ctypes call; other ops run their numpy lowering and copy into their planned buffer.
Afterwards a call copies the inputs into the arena, runs the pre-bound calls and copies the outputs out:
no allocation on the request path but the outputs the caller keeps.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynshape.codegen import gemm, program, row_kernels
from dynshape.errors import DynshapeError
from dynshape.ir.types import TensorType
from dynshape.runtime.binder import to_py
from dynshape.sym import Expr

_PLAIN = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
          "float64"}
_NATIVE = {"MatMul", "Gemm", "LayerNormalization", "Softmax", "Transpose", "Expand", "Cast", "Gather"}
ALIAS_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}
ALIGN = 64


@dataclass
class BoundPlan:
    inputs: list  # arena views the call's input arrays are copied into
    calls: list  # zero-argument callables, in order
    outputs: list  # (name, array view or fixed array)
    arena: np.ndarray
    keep: list  # per-key arrays the calls' raw addresses point into (kept alive here)
    labels: list  # per call: the node(s) it runs, for error messages
    nbytes: int = 0  # memory of the values computed once for this key (outside the arena)

    def run(self, arrays: list) -> dict:
        for view, a in zip(self.inputs, arrays):
            if view is not None:
                view[...] = a
        i = 0
        try:
            for call in self.calls:
                call()
                i += 1
        except Exception as e:  # data-dependent failures (an index out of range): name the node
            raise DynshapeError(f"{self.labels[i]} failed at run time: {type(e).__name__}: {e}") from e
        return {name: np.array(v, copy=True) for name, v in self.outputs}


def plannable(exe: Any, variant: Any) -> bool:
    """Every value a step touches is a tensor whose shape the call's symbols determine, and no step
    needs the interpreter's scope (If/Loop bodies)."""
    g = variant.graph
    names = {s.name for s in exe.symbols}
    for step in variant.steps:
        if step.needs_scope:
            return False
        for x in (*step.inputs, *step.outputs):
            if not x or x in variant.fixed:
                continue
            t = g.types.get(x)
            if not isinstance(t, TensorType) or t.dtype == object or np.dtype(t.dtype).kind not in "biuf":
                return False
            if any(isinstance(d, Expr) and not d.free_symbols <= names for d in t.shape):
                return False
    return all(isinstance(g.types.get(v.name), TensorType) for v in (*g.inputs, *g.outputs))


class Planner:
    """What does not depend on the key: value order, lifetimes, aliasing, shape functions."""

    def __init__(self, exe: Any, variant: Any):
        self.exe, self.variant, g = exe, variant, variant.graph
        self.fixed = {k: _contiguous(v) for k, v in variant.fixed.items()}
        self.fixed_addr = {id(v): v.ctypes.data for v in self.fixed.values()}
        inputs = [v.name for v in g.inputs]
        # steps that read only constants and the key's symbolic values (position ids, masks built from shapes,
        # token-type embeddings): computed once per key when the plan is bound, never on the request path
        known = set(self.fixed) | _symbolic_names(exe, variant)
        self.per_key: list[int] = []
        per_key_values: set[str] = set()
        for i, s in enumerate(variant.steps):
            ins = [x for x in s.inputs if x]
            if ins and not s.needs_scope and not s.op_type.startswith(_RANDOM) \
                    and all(x in known or x in per_key_values for x in ins):
                self.per_key.append(i)
                per_key_values.update(o for o in s.outputs if o)
        produced = [o for s in variant.steps for o in s.outputs if o]
        self.values = [x for x in dict.fromkeys(inputs + produced) if x not in self.fixed and x not in per_key_values]
        # aliasing: outputs of view-like ops share their input's buffer
        self.base: dict[str, str] = {x: x for x in self.values}
        self.alias_step: set[int] = set()
        for i, s in enumerate(variant.steps):
            if s.op_type in ALIAS_OPS and s.inputs and s.inputs[0] in self.base and s.outputs[0] in self.base \
                    and len([o for o in s.outputs if o]) == 1:
                self.base[s.outputs[0]] = self.base[s.inputs[0]]
                self.alias_step.add(i)
        end = len(variant.steps)
        self.first: dict[str, int] = {}
        self.last: dict[str, int] = {}
        for x in inputs:
            self.first[x] = -1
        for i, s in enumerate(variant.steps):
            for o in s.outputs:
                if o in self.base:
                    b = self.base[o]
                    self.first.setdefault(b, i)
                    self.last[b] = max(self.last.get(b, i), i)
            for x in s.inputs:
                if x in self.base:
                    b = self.base[x]
                    self.last[b] = max(self.last.get(b, i), i)
        for v in g.outputs:
            if v.name in self.base:
                self.last[self.base[v.name]] = end
        self.buffers = [x for x in self.values if self.base[x] == x]
        span = {b: (self.first.get(b, -1), self.last.get(b, -1)) for b in self.buffers}
        self.overlaps = {b: [o for o in self.buffers if o != b and not (span[o][1] < span[b][0]
                                                                        or span[b][1] < span[o][0])]
                         for b in self.buffers}  # lifetimes do not depend on the key: computed once
        self.dtypes = {x: np.dtype(g.types[x].dtype) for x in self.values}
        sym_names = {s.name: f"s{i}" for i, s in enumerate(exe.symbols)}
        unpack = "".join(f"{n}, " for n in sym_names.values())
        body = ", ".join("(" + "".join(to_py(d, sym_names) + ", " for d in g.types[x].shape) + ")"
                         for x in self.values)
        src = "def shapes(key):\n" + (f"    ({unpack}) = key\n" if exe.symbols else "") + f"    return [{body}]\n"
        scope: dict = {}
        exec(src, scope)  # noqa: S102 - our own generated source
        self.shapes = scope["shapes"]

    def layout(self, key: tuple) -> tuple[dict, dict, int]:
        """(shape per value, byte offset per buffer, arena size) for one key: first-fit by lifetime."""
        g = self.variant.graph
        shapes = dict(zip(self.values, self.shapes(key)))
        sizes = {b: -(-max(1, math.prod(shapes[b]) * np.dtype(g.types[b].dtype).itemsize) // ALIGN) * ALIGN
                 for b in self.buffers}
        offsets: dict[str, int] = {}
        total = 0
        for b in sorted(self.buffers, key=lambda b: -sizes[b]):
            clashes = sorted((offsets[o], offsets[o] + sizes[o]) for o in self.overlaps[b] if o in offsets)
            at = 0
            for start, stop in clashes:
                if at + sizes[b] <= start:
                    break
                at = max(at, stop)
            offsets[b] = at
            total = max(total, at + sizes[b])
        return shapes, offsets, total

    def bind(self, key: tuple, arena: np.ndarray, shapes: dict, offsets: dict, symvals: dict) -> BoundPlan:
        g, variant = self.variant.graph, self.variant
        base = arena.ctypes.data
        views: dict[str, np.ndarray] = {}
        addrs = dict(self.fixed_addr)  # id(array) -> address, so binding never asks numpy for pointers
        for x in self.values:
            off = offsets[self.base[x]]
            v = np.ndarray(shapes[x], self.dtypes[x], buffer=arena, offset=off)
            views[x] = v
            addrs[id(v)] = base + off
        fixed = dict(self.fixed)
        for k, v in symvals.items():
            fixed[k] = v = _contiguous(v)
            addrs[id(v)] = v.ctypes.data
        keep: list = []
        per_key_bytes = 0
        for i in self.per_key:
            s = variant.steps[i]
            args = [fixed[x] if x else None for x in s.inputs]
            try:
                outs = s.fn(args, key) if s.needs_key else s.fn(args)
            except Exception as e:  # an index the shapes put out of range: name the node, as run time does
                raise DynshapeError(f"node {s.label!r} ({s.op_type}) failed for this shape: "
                                    f"{type(e).__name__}: {e}") from e
            for name, out in zip(s.outputs, outs):
                if name:
                    fixed[name] = v = _contiguous(np.asarray(out, dtype=g.types[name].dtype))
                    addrs[id(v)] = v.ctypes.data
                    keep.append(v)
                    per_key_bytes += v.nbytes

        def addr(a: np.ndarray) -> int:
            return addrs.get(id(a)) or a.ctypes.data

        def get(x):
            return None if not x else views[x] if x in views else fixed[x]

        calls: list = []
        labels: list = []
        skip = self.alias_step | set(self.per_key)
        for i, s in enumerate(variant.steps):
            if i in skip:
                continue
            ins, outs = [get(x) for x in s.inputs], [get(o) for o in s.outputs]
            made = _bind_gather_nd(s, ins, outs, fixed) or _bind_step(s, ins, outs, key, keep, addr)
            calls.extend(made)
            labels.extend([f"node {s.label!r} ({s.op_type})"] * len(made))
        inputs = [views.get(v.name) for v in g.inputs]
        outputs = [(v.name, get(v.name)) for v in g.outputs]
        calls, labels = _programs(calls, labels, keep)
        return BoundPlan(inputs, calls, outputs, arena, keep, labels, per_key_bytes)


_RANDOM = ("Random", "Multinomial", "Bernoulli", "Dropout")


def _symbolic_names(exe: Any, variant: Any) -> set:
    """Names of the shape-derived values the generic build computes from the key (none in static variants)."""
    return set(exe._probe_symbolic(variant.symbolic)) if variant.symbolic is not None else set()


def _ctypes_addr(a: np.ndarray) -> int:
    return a.ctypes.data


def _contiguous(a: np.ndarray) -> np.ndarray:
    """C-contiguous without changing the rank (np.ascontiguousarray turns 0-d arrays into 1-d)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _bind_step(s: Any, ins: list, outs: list, key: tuple, keep: list, addr=None) -> list:
    """Zero-argument callables running step s from `ins` into the planned buffers `outs`."""
    _addr = addr or _ctypes_addr
    if s.kernel is not None:  # a fused C kernel: dims and every address fixed now
        k, cfunc, dims = s.kernel
        dyn, _ = dims(key)
        d = np.array(dyn, dtype=np.int64)
        keep.append(d)
        args = [_addr(d), *[_addr(o) for o in outs], *[_addr(a) for a in ins]]
        keep.extend(ins)
        return [functools.partial(cfunc, *args)]
    fast = _bind_native(s, ins, outs, keep, _addr) if s.op_type in _NATIVE else None
    if fast is not None:
        return fast
    fn = s.fn

    def call():
        res = fn(ins)
        for view, r in zip(outs, res):
            if view is not None:
                view[...] = r

    return [call]


_INT_ARGS = {ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_ssize_t,
             ctypes.c_int, ctypes.c_long, ctypes.c_longlong}


def _native(call) -> tuple | None:
    """(entry address, int args) of a pre-bound call to a C function taking only pointers and int64s."""
    if not isinstance(call, functools.partial) or call.keywords or not isinstance(call.func, ctypes._CFuncPtr):
        return None
    args = [0 if a is None else a for a in call.args]
    if len(args) > program.MAX_ARGS or not all(type(a) is int for a in args):
        return None
    if any(t not in _INT_ARGS for t in (call.func.argtypes or ())):  # a float parameter travels elsewhere
        return None
    return program.address(call.func), args


def _programs(calls: list, labels: list, keep: list) -> tuple[list, list]:
    """Runs of two or more native calls become one ds_run_program call over an int64 program."""
    lib = program.LIBRARY.try_load()
    if lib is None:
        return calls, labels
    out: list = []
    run: list = []  # (call, label, (entry, args)) of the native calls since the last Python one

    def flush():
        if len(run) >= 2:
            prog = np.array([x for _, _, (fn, args) in run for x in (fn, len(args), *args)], dtype=np.int64)
            keep.append(prog)
            out.append((functools.partial(lib.ds_run_program, prog.ctypes.data, len(run)),
                        f"{run[0][1]} .. {run[-1][1]} ({len(run)} native steps)"))
        else:
            out.extend((call, label) for call, label, _ in run)
        run.clear()

    for call, label in zip(calls, labels):
        nat = _native(call)
        if nat is None:
            flush()
            out.append((call, label))
        else:
            run.append((call, label, nat))
    flush()
    return [c for c, _ in out], [lb for _, lb in out]


def _bind_gather_nd(s: Any, ins: list, outs: list, fixed: dict) -> list | None:
    """GatherND whose indices are fixed for the key (built from shapes): flat positions computed and bounds
    checked once, so the call is one np.take."""
    if s.op_type != "GatherND" or len(ins) != 2 or s.inputs[1] not in fixed or outs[0] is None:
        return None
    x, idx = ins
    b = int(s.attrs.get("batch_dims", 0))
    k = idx.shape[-1]
    dims = np.array(x.shape[b:b + k], dtype=np.int64)
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + dims, idx)
    if ((idx < 0) | (idx >= dims)).any():
        raise DynshapeError(f"node {s.label!r} (GatherND): an index is out of range for data of shape {x.shape}")
    nb, inner = math.prod(x.shape[:b]), math.prod(x.shape[b + k:])
    pos = np.ravel_multi_index(tuple(np.moveaxis(idx.reshape(nb, -1, k), -1, 0)), x.shape[b:b + k]) if k else \
        np.zeros((nb, 1), np.int64)
    pos = pos + (np.arange(nb)[:, None] * math.prod(x.shape[b:b + k]))
    flat = (pos[..., None] * inner + np.arange(inner)).reshape(-1)
    src, dst = x.reshape(-1), outs[0].reshape(-1)
    if dst.size != flat.size:
        return None
    return [functools.partial(np.take, src, flat, out=dst, mode="clip")]


def _bind_copy(s: Any, ins: list, outs: list, keep: list) -> list | None:
    """Ops that only move data: the source view is fixed for the key, so the call is one strided copy in C
    (same dtypes) or one np.copyto."""
    op, out = s.op_type, outs[0] if outs else None
    if out is None or not ins or ins[0] is None or len([o for o in outs if o is not None]) != 1:
        return None
    x = ins[0]
    if op == "Transpose":
        perm = s.attrs.get("perm")
        src = x.transpose(perm) if perm is not None else x.T
    elif op == "Expand" and x.dtype == out.dtype:
        try:
            src = np.broadcast_to(x, out.shape)
        except ValueError:
            return None
    elif op == "Cast" and x.dtype.name in _PLAIN and out.dtype.name in _PLAIN \
            and not (x.dtype.kind == "f" and out.dtype.kind in "iub"):
        src = x  # conversions numpy and ONNX agree on (float -> int/bool and the ml_dtypes formats are left out)
    elif op == "Gather" and x.ndim >= 1 and ins[1] is not None and ins[1].dtype.kind in "iu" and ins[1].ndim:
        axis, idx = s.attrs.get("axis", 0), ins[1]
        axis = axis + x.ndim if axis < 0 else axis

        n = x.shape[axis]

        def gather():
            # mode="raise" copies through a temporary buffer (3x slower on bert's embeddings): the indices are
            # checked here, then "wrap" maps the admissible negative ones as ONNX does (-1 is the last)
            if idx.size and (idx.min() < -n or idx.max() >= n):
                np.take(x, idx, axis=axis)  # raises the out-of-range error, names the index
            np.take(x, idx, axis=axis, out=out, mode="wrap")

        return [gather]
    else:
        return None
    if src.shape != out.shape:
        return None
    lib = program.LIBRARY.try_load()
    if lib is not None and src.dtype == out.dtype and out.flags.c_contiguous and src.ndim <= 16:
        desc = np.array([src.ndim, src.itemsize, out.ctypes.data, src.ctypes.data, *src.shape, *src.strides],
                        dtype=np.int64)
        keep.extend((desc, src))
        return [functools.partial(lib.ds_copy_strided, desc.ctypes.data)]
    return [functools.partial(np.copyto, out, src, casting="unsafe")]


def _bind_native(s: Any, ins: list, outs: list, keep: list, _addr) -> list | None:
    """MatMul / Gemm / LayerNormalization / Softmax straight to their C entry points, else None."""
    op = s.op_type
    copy = _bind_copy(s, ins, outs, keep)
    if copy is not None:
        return copy
    f32 = np.float32
    if any(a is not None and a.dtype != f32 for a in (*ins, *[o for o in outs if o is not None])):
        return None
    if op == "MatMul":
        a, b = ins
        c = outs[0]
        layout = gemm.batch_layout(a.shape, b.shape)
        if gemm._kernel() is None or layout is None:
            return None
        batch, m, n, k, sa, sb = layout
        return [gemm.packed_call(_addr(a), _addr(b), _addr(c), batch, m, n, k, sa, sb, 0, 0, 1.0, 0.0, keep)]
    if op == "Gemm":
        fn = gemm._kernel()
        attrs = s.attrs
        a, b = ins[0], ins[1]
        bias = ins[2] if len(ins) > 2 else None
        c = outs[0]
        if fn is None or a.ndim != 2 or b.ndim != 2:
            return None
        ta, tb = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        m, k = (a.shape[1], a.shape[0]) if ta else a.shape
        n = c.shape[1]
        calls = []
        if bias is None or beta == 0.0:
            beta = 0.0
        else:
            calls.append(functools.partial(np.copyto, c, np.broadcast_to(bias, c.shape)))
        calls.append(gemm.packed_call(_addr(a), _addr(b), _addr(c), 1, m, n, k, 0, 0, ta, tb, alpha, beta, keep))
        return calls
    if op == "LayerNormalization" and len([o for o in outs if o is not None]) == 1:
        lib = row_kernels.library()
        x, scale = ins[0], ins[1]
        bias = ins[2] if len(ins) > 2 else None
        axis = s.attrs.get("axis", -1)
        n = x.shape[-1] if x.ndim else 0
        if lib is None or axis not in (-1, x.ndim - 1) or not n or scale.size != n or \
                (bias is not None and bias.size != n):
            return None
        eps = np.array([s.attrs.get("epsilon", 1e-5)], np.float32).view(np.int32)[0]
        args = np.array([_addr(x), _addr(scale), 0 if bias is None else _addr(bias), _addr(outs[0]), x.size // n, n,
                         eps], dtype=np.int64)
        keep.append(args)
        return [functools.partial(lib.ds_layernorm_args, args.ctypes.data)]
    if op == "Softmax" and s.attrs.get("_opset", 13) >= 13:
        lib = row_kernels.library()
        x = ins[0]
        if lib is None or x.ndim == 0 or s.attrs.get("axis", -1) not in (-1, x.ndim - 1) or not x.shape[-1]:
            return None
        n = x.shape[-1]
        return [functools.partial(lib.ds_softmax_f32, _addr(x), _addr(outs[0]), x.size // n, n)]
    return None
