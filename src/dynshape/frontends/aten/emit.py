"""Building a dynshape `Graph` node by node, as the ATen converter walks an FX graph.

The emitter keeps, beside the nodes, what later steps need to know about each value: its dims (`int | Expr`)
and dtype as torch's FakeTensors gave them, whether it is a constant (and its array, for folding), and a
*structure key*: a description of how the value was computed that does not depend on value names.  Two
conversions with equal key streams compute the same function of their inputs, which is how a graph Dynamo
specialised (batch = 1) is recognised as an earlier graph with that symbol fixed.

Sizes given as expressions become shape tensors built from `Shape` of the graph inputs that carry each symbol;
dynshape's inference knows their values exactly (object arrays of `int | Expr`) and the compiler turns them into
per-call constants, so none of it runs per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import dynshape.ops  # noqa: F401  (the op table `_random` reads)
from dynshape.frontends.aten.symbols import Unsupported
from dynshape.ir import opdef
from dynshape.ir.graph import Graph, Node, Value
from dynshape.sym import Expr, Symbol, is_expr

OPSET = 18


def _random(op: str) -> bool:
    """Whether the default-domain op `op` draws random values (the op table's `random`: one list, not a copy)."""
    d = opdef.lookup(op)
    return d is not None and d.random


@dataclass(frozen=True)
class Tensor:
    """A tensor value of the graph being built (a name), as opposed to a Python scalar or a size."""

    name: str


def _attr_key(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ("arr", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    return v


class Emitter:
    """Accumulates nodes, inputs and initializers; `graph()` returns the dynshape Graph (dead nodes dropped)."""

    def __init__(self, name: str = "torch") -> None:
        self.name = name
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []
        self.inits: dict[str, np.ndarray] = {}
        self.shape: dict[str, tuple] = {}
        self.dtype: dict[str, np.dtype] = {}
        self.key: dict[str, Any] = {}
        self.stream: list[Any] = []
        self.reshape_src: dict[str, str] = {}  # value made by a Reshape -> the value it reshapes
        self._names: set[str] = set()
        self._const_memo: dict[Any, str] = {}
        self._node_memo: dict[Any, list[str]] = {}
        self._shape_memo: dict[Any, str] = {}
        self._carriers: dict[str, tuple[str, int, int, int]] = {}  # symbol -> (input, axis, coeff, offset)
        self._input_shapes: dict[tuple, str] = {}

    # ---- names -----------------------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        base = "".join(c if c.isalnum() or c in "_." else "_" for c in hint) or "v"
        name, k = base, 1
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    # ---- inputs and constants --------------------------------------------------------------------------
    def input(self, name: str, dtype: np.dtype, dims: tuple) -> Tensor:
        """A graph input with dims `int | Expr`; a bare symbol (or c*s + k) on an axis lets shape tensors use it."""
        name = self.fresh(name)
        self.inputs.append(Value(name, np.dtype(dtype), tuple(dims)))
        self.shape[name], self.dtype[name] = tuple(dims), np.dtype(dtype)
        self.key[name] = ("in", len(self.inputs) - 1, np.dtype(dtype).str, tuple(dims))
        self.stream.append(self.key[name])
        for axis, d in enumerate(dims):
            lin = _linear(d)
            if lin is not None and lin[0].name not in self._carriers:
                self._carriers[lin[0].name] = (name, axis, lin[1], lin[2])
        self._input_shapes.setdefault(tuple(dims), name)
        return Tensor(name)

    def const(self, arr: np.ndarray, key: Any = None, hint: str = "const") -> Tensor:
        """An initializer; `key` identifies it across conversions (default: its bytes), equal keys share one."""
        arr = np.asarray(arr)
        if key is None:
            key = ("lit", arr.dtype.str, arr.shape, arr.tobytes())
        hit = self._const_memo.get(key)
        if hit is not None:
            return Tensor(hit)
        name = self.fresh(hint)
        self.inits[name] = arr
        self.shape[name], self.dtype[name] = tuple(int(d) for d in arr.shape), arr.dtype
        self.key[name] = key
        self._const_memo[key] = name
        return Tensor(name)

    def const_value(self, t: Tensor | Any) -> np.ndarray | None:
        return self.inits.get(t.name) if isinstance(t, Tensor) else None

    # ---- nodes -----------------------------------------------------------------------------------------
    def node(self, op: str, inputs: list, attrs: dict | None = None, *, n_out: int = 1, hint: str | None = None,
             shape: tuple | None = None, dtype: Any = None, shapes: list | None = None,
             dtypes: list | None = None) -> Any:
        """Append one node; returns its output Tensor (or a list when n_out > 1). `inputs` holds Tensors or None
        (an omitted optional input). shape/dtype (or shapes/dtypes per output) are bookkeeping for later rules."""
        attrs = dict(attrs or {})
        names = [x.name if isinstance(x, Tensor) else "" for x in inputs]
        for x in inputs:
            if x is not None and not isinstance(x, Tensor):
                raise TypeError(f"{op}: input {x!r} is not a Tensor")
        key = (op, tuple(sorted((k, _attr_key(v)) for k, v in attrs.items())),
               tuple(self.key[n] if n else None for n in names), n_out)
        hit = self._node_memo.get(key)
        if hit is not None:  # the same op on the same values (ATen graphs repeat arange, masks, views): one node
            ts = [Tensor(o) for o in hit]
            return ts if n_out > 1 else ts[0]
        base = hint or op.lower()
        outs = [self.fresh(base if i == 0 else f"{base}_out{i}") for i in range(n_out)]
        self.nodes.append(Node(op, "", self.fresh(f"{base}_node" if hint else base), attrs, names, outs))
        idx = len(self.stream)
        self.stream.append(key[:3])
        if not _random(op):  # a random draw is never the same node as an earlier one
            self._node_memo[key] = outs
        shapes = shapes or [shape] * n_out
        dtypes = dtypes or [dtype] * n_out
        for i, o in enumerate(outs):
            self.key[o] = ("n", idx, i)
            if shapes[i] is not None:
                self.shape[o] = tuple(shapes[i])
            if dtypes[i] is not None:
                self.dtype[o] = np.dtype(dtypes[i])
        ts = [Tensor(o) for o in outs]
        return ts if n_out > 1 else ts[0]

    # ---- sizes as tensors ------------------------------------------------------------------------------
    def ints(self, values: list | tuple) -> Tensor:
        return self.const(np.asarray(list(values), dtype=np.int64), hint="ints")

    def dim(self, d: Any) -> Tensor:
        """A 1-element int64 tensor holding the size `d` (an int or an expression of input symbols)."""
        return self.shape_tensor((d,))

    def shape_tensor(self, dims: tuple | list) -> Tensor:
        """A 1-D int64 tensor holding `dims` (ints and expressions): a constant when all are ints, else built
        from `Shape` of inputs; inference knows its value exactly."""
        dims = tuple(dims)
        if all(isinstance(d, (int, np.integer)) for d in dims):
            return self.ints([int(d) for d in dims])
        hit = self._shape_memo.get(dims)
        if hit is not None:
            return Tensor(hit)
        src = self._input_shapes.get(dims)
        if src is not None:
            out = self.node("Shape", [Tensor(src)], hint="shape", shape=(len(dims),), dtype=np.int64)
        elif len(dims) == 1:
            out = self._expr_tensor(dims[0])
        else:
            pieces, run = [], []
            for d in dims:
                if isinstance(d, (int, np.integer)):
                    run.append(int(d))
                    continue
                if run:
                    pieces.append(self.ints(run))
                    run = []
                pieces.append(self.dim(d))
            if run:
                pieces.append(self.ints(run))
            out = self.node("Concat", pieces, {"axis": 0}, hint="shape", shape=(len(dims),), dtype=np.int64)
        self._shape_memo[dims] = out.name
        return out

    def _expr_tensor(self, e: Expr) -> Tensor:
        lin = _linear(e)
        if lin is not None and lin[1:] == (1, 0):
            return self._symbol_tensor(lin[0])
        total: Tensor | None = None
        for mono, coeff in e.terms:
            t: Tensor | None = None
            for atom in mono:
                a = self._atom_tensor(atom)
                t = a if t is None else self._bin("Mul", t, a)
            assert t is not None
            if coeff != 1:
                t = self._bin("Mul", t, self.ints([coeff]))
            total = t if total is None else self._bin("Add", total, t)
        assert total is not None
        if e.const:
            total = self._bin("Add", total, self.ints([e.const]))
        return total

    def _atom_tensor(self, atom: Any) -> Tensor:
        if isinstance(atom, Symbol):
            return self._symbol_tensor(atom)
        args = [self.dim(a) for a in atom.args]
        op = {"fdiv": "Div", "mod": "Mod", "min": "Min", "max": "Max"}[atom.op]
        out = args[0]
        for a in args[1:]:
            out = self._bin(op, out, a)  # sizes are >= 0, so Div's truncation is floor division here
        return out

    def _bin(self, op: str, a: Tensor, b: Tensor) -> Tensor:
        return self.node(op, [a, b], hint="size", shape=(1,), dtype=np.int64)

    def _symbol_tensor(self, s: Symbol) -> Tensor:
        car = self._carriers.get(s.name)
        if car is None:
            raise Unsupported(f"the size {s.name} is used as a value, but no graph input carries it on an axis")
        name, axis, coeff, off = car
        t = self.node("Shape", [Tensor(name)], {"start": axis, "end": axis + 1}, hint=f"{s.name}_dim",
                      shape=(1,), dtype=np.int64)
        if off:
            t = self._bin("Sub", t, self.ints([off]))
        if coeff != 1:
            t = self._bin("Div", t, self.ints([coeff]))
        return t

    # ---- result -----------------------------------------------------------------------------------------
    def graph(self, outputs: list[Tensor], names: list[str] | None = None) -> Graph:
        """The Graph computing `outputs`, named `names` when given (a value produced by a node is renamed; an
        input, a constant or a value returned twice gets an Identity)."""
        names = names or [t.name for t in outputs]
        out_vals: list[Value] = []
        seen: set[str] = set()
        fixed = {v.name for v in self.inputs} | set(self.inits)
        for t, want in zip(outputs, names):
            if want in fixed:
                want = self.fresh(want)  # an output named like an input or constant gets a suffix
            src = t.name
            if src in seen or src in fixed:
                t = self.node("Identity", [t], hint=want, shape=self.shape.get(src), dtype=self.dtype.get(src))
            if t.name != want:
                self._rename(t.name, want)
                t = Tensor(want)
            seen.add(t.name)
            out_vals.append(Value(t.name, self.dtype.get(t.name, np.dtype(np.float32)), None))
        nodes = _live(self.nodes, {v.name for v in out_vals})
        used = {x for n in nodes for x in n.inputs if x}
        inits = {k: v for k, v in self.inits.items() if k in used}
        return Graph(self.name, list(self.inputs), out_vals, nodes, inits, {}, opset_imports={"": OPSET})

    def _rename(self, old: str, new: str) -> None:
        """Give a node output the name `new` (a value of that name, if any, is renamed out of the way)."""
        if new in self._names:
            self._rename(new, self.fresh(new))
        for n in self.nodes:
            n.outputs = [new if o == old else o for o in n.outputs]
            n.inputs = [new if x == old else x for x in n.inputs]
        for table in (self.shape, self.dtype, self.key):
            if old in table:
                table[new] = table.pop(old)
        self._names.add(new)


def _linear(d: Any) -> tuple[Symbol, int, int] | None:
    """(symbol, c, k) when d == c*symbol + k with c > 0."""
    if not is_expr(d) or len(d.terms) != 1:
        return None
    (mono, coeff), = d.terms
    if len(mono) != 1 or not isinstance(mono[0], Symbol) or coeff <= 0:
        return None
    return mono[0], coeff, d.const


def _live(nodes: list[Node], needed: set[str]) -> list[Node]:
    need = set(needed)
    keep: list[Node] = []
    for n in reversed(nodes):
        if any(o in need for o in n.outputs if o):
            keep.append(n)
            need.update(x for x in n.inputs if x)
    keep.reverse()
    return keep
