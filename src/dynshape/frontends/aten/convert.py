"""An ATen-level FX graph (aot_autograd's or torch.export's, core ATen decompositions) as a dynshape Graph.

The walk maps every FX node to a dynshape value: a `Tensor` (a value of the graph being built), a Python
number, or a size (`int | Expr`, for SymInt nodes such as `sym_size` and `operator.mul`). Op handlers live
in `ops_*.py`, one per ATen overload, each emitting dynshape's ONNX-named ops.

What the walk adds on top of the handlers:
- constants: parameters and buffers become initializers; an op whose tensor inputs are all constants (a weight
  transposed for a product, a buffer sliced by constants) is evaluated by torch itself here, so the compiler
  sees the folded weight and packs it (its own folding stops at 65,536 elements);
- every unsupported op is collected before one error lists them all, with counts and an example node;
- structure keys (see `emit.py`) describe the result independently of value names.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynshape.frontends.aten.emit import Emitter, Tensor
from dynshape.frontends.aten.symbols import SymbolTable, Unsupported, condition, to_expr
from dynshape.ir.graph import Graph
from dynshape.sym import is_expr

Handler = Callable[..., Any]
HANDLERS: dict[str, Handler] = {}

FOLD_MAX_ELEMENTS = 1 << 24  # fold constant subgraphs up to 64 MB of float32
NO_FOLD = ("rand", "bernoulli", "dropout", "normal", "uniform", "multinomial", "empty", "randperm", "poisson")


def handles(*names: str) -> Callable[[Handler], Handler]:
    """Register a handler for ATen overloads (`"add.Tensor"`) or whole packets (`"add"`)."""

    def deco(fn: Handler) -> Handler:
        for n in names:
            HANDLERS[n] = fn
        return fn

    return deco


class Poison:
    """The value of a node that could not be converted: later nodes reading it are skipped, not reported."""


@dataclass
class PlaceholderSpec:
    """What one FX placeholder is: a graph input ("input", name), a constant ("const", tensor, key), a size
    Dynamo passes as an int ("size"), or a tensor of static shape the graph never reads ("unused": a module float
    the backend made a constant, still passed by Dynamo's call)."""

    kind: str
    name: str = ""
    value: Any = None  # the real tensor of a constant
    key: Any = None  # identity of a constant across conversions


@dataclass
class Conversion:
    """The converted graph and what callers need beside it."""

    graph: Graph
    stream: list  # structure keys: equal streams compute the same function
    outputs: list  # per FX output: ("tensor", graph output name) | ("value", int | Expr | float | bool | None)
    input_positions: list[int]  # FX placeholder index of each graph input, in graph-input order
    facts: list = field(default_factory=list)  # (condition, text, origin) from torch's runtime asserts
    notes: list[str] = field(default_factory=list)


def op_name(target: Any) -> str:
    """`add.Tensor` for aten ops, `ns::op.overload` for other namespaces, the function name otherwise."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        ns, _, base = schema.name.partition("::")
        overload = getattr(target, "_overloadname", "") or "default"
        return f"{base}.{overload}" if ns == "aten" else f"{ns}::{base}.{overload}"
    return getattr(target, "__name__", str(target))


_NP_DTYPES = {
    "float32": np.float32, "float64": np.float64, "float16": np.float16, "int64": np.int64, "int32": np.int32,
    "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_,
}


def np_dtype(dt: Any) -> np.dtype:
    """numpy dtype of a torch dtype (bfloat16 through ml_dtypes); Unsupported for complex and the like."""
    name = str(dt).replace("torch.", "")
    if name in _NP_DTYPES:
        return np.dtype(_NP_DTYPES[name])
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    raise Unsupported(f"dtype {dt} has no dynshape equivalent")


def frozen_view(t: Any) -> np.ndarray:
    """A weight's data as a read-only numpy view (no copy: 30 MB for the bench BERT, 40 ms of its compile), or a
    copy where no view exists (another device, bfloat16, non-contiguous). Read-only, so no pass can write into
    the model's parameters; a parameter the user changes later is caught by the backend's per-call weight
    check (`check_weights`), which rebuilds."""
    import torch

    t = t.detach()
    if t.device.type != "cpu" or t.dtype == torch.bfloat16 or not t.is_contiguous() or t.is_conj() or t.is_neg():
        return to_numpy(t)
    a = t.numpy()
    a.flags.writeable = False
    return a


def to_numpy(t: Any) -> np.ndarray:
    """A copy of a CPU tensor's data as numpy (bfloat16 by bit pattern)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np_dtype(t.dtype)).copy()
    return np.array(t.numpy(), copy=True)


class Converter:
    """One FX graph -> dynshape Graph. `placeholders` says what each placeholder is, in order."""

    def __init__(self, gm: Any, table: SymbolTable, placeholders: list[PlaceholderSpec], *, name: str = "torch",
                 exact_safe_softmax: bool = False) -> None:
        self.gm, self.table, self.specs = gm, table, placeholders
        self.em = Emitter(name)
        self.env: dict[Any, Any] = {}
        self.exact_safe_softmax = exact_safe_softmax
        self.unsupported: dict[str, list[str]] = {}
        self.facts: list = []
        self.notes: list[str] = []
        self.current: Any = None
        self.transposed: dict[str, tuple] = {}  # Transpose output -> (input, perm)
        self.expanded: dict[str, Tensor] = {}  # Expand output -> its input
        self.unsqueezed: dict[str, tuple] = {}  # Unsqueeze output -> (source, inserted axes)

    # ---- sizes and metadata ----------------------------------------------------------------------------
    def expr(self, x: Any, what: str = "a size") -> Any:
        return to_expr(x, self.table, what)

    def meta(self, node: Any) -> Any:
        return node.meta.get("val", node.meta.get("example_value"))

    def dims(self, fake: Any) -> tuple:
        return tuple(self.expr(d, "a tensor size") for d in fake.shape)

    def out_dims(self, node: Any | None = None, index: int | None = None) -> tuple:
        v = self.meta(node if node is not None else self.current)
        if index is not None:
            v = v[index]
        return self.dims(v)

    def out_dtype(self, node: Any | None = None, index: int | None = None) -> np.dtype:
        v = self.meta(node if node is not None else self.current)
        if index is not None:
            v = v[index]
        return np_dtype(v.dtype)

    def shape_of(self, t: Tensor) -> tuple:
        s = self.em.shape.get(t.name)
        if s is None:
            raise Unsupported(f"internal: no shape recorded for {t.name!r}")
        return s

    def dtype_of(self, t: Tensor) -> np.dtype:
        return self.em.dtype[t.name]

    # ---- the walk --------------------------------------------------------------------------------------
    def run(self, output_names: list[str] | None = None) -> Conversion:
        positions: list[int] = []
        k = 0
        out_node = None
        for node in self.gm.graph.nodes:
            self.current = node
            if node.op == "placeholder":
                spec = self.specs[k]
                val = self._placeholder(node, spec)
                if spec.kind == "input":
                    positions.append(k)
                self.env[node] = val
                k += 1
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "get_attr":
                self.env[node] = self._get_attr(node)
            elif node.op == "output":
                out_node = node
            else:
                self._unsupported(f"{node.op} {node.target}", node, "not an ATen-level node")
                self.env[node] = Poison()
        if self.unsupported:
            raise unsupported_error(self.unsupported)
        assert out_node is not None
        flat = _flatten(out_node.args[0])
        tensors: list[Tensor] = []
        outputs: list = []
        names: list[str] = []
        for i, x in enumerate(flat):
            v = self.env[x] if _is_fx(x) else x
            if isinstance(v, Tensor):
                tensors.append(v)
                names.append(output_names[len(names)] if output_names else f"output_{i}")
                outputs.append(("tensor", names[-1]))
            else:
                outputs.append(("value", v))
        out_keys = ("out", tuple(self.em.key[t.name] for t in tensors))
        graph = self.em.graph(tensors, names)
        return Conversion(graph, self.em.stream + [out_keys], outputs, positions, self.facts, self.notes)

    def _placeholder(self, node: Any, spec: PlaceholderSpec) -> Any:
        v = self.meta(node)
        if spec.kind == "unused":
            return None
        if spec.kind == "size" or not hasattr(v, "shape"):
            return self.expr(v, f"placeholder {node.name}") if v is not None else None
        if spec.kind == "const":
            return self.em.const(frozen_view(spec.value), key=("param", spec.key), hint=spec.name or node.name)
        return self.em.input(spec.name or node.name, np_dtype(v.dtype), self.dims(v))

    def _get_attr(self, node: Any) -> Any:
        obj = self.gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        if hasattr(obj, "shape") and hasattr(obj, "dtype"):
            return self.em.const(frozen_view(obj), key=("attr", str(node.target), id(obj)), hint=str(node.target))
        self._unsupported(f"get_attr {node.target}", node, f"a {type(obj).__name__}, not a tensor")
        return Poison()

    def _call(self, node: Any) -> Any:
        target = node.target
        if target is operator.getitem:
            seq, idx = self.arg(node.args[0]), node.args[1]
            return seq if isinstance(seq, Poison) else seq[idx]
        name = op_name(target)
        val = self.meta(node)
        if _is_sym_scalar(val) or name in _SIZE_OPS:
            return self._scalar_node(node, name, val)
        if name in _ASSERTS:
            self._assert(node, name)
            return None
        args = [self.arg(a) for a in node.args]
        kwargs = {k: self.arg(a) for k, a in node.kwargs.items()}
        if any(isinstance(a, Poison) for a in _flatten([args, list(kwargs.values())])):
            return Poison()
        folded = self._fold(node, name, args, kwargs)
        if folded is not None:
            return folded
        fn = HANDLERS.get(name) or HANDLERS.get(name.split(".")[0])
        if fn is None:
            self._unsupported(name, node, None)
            return Poison()
        try:
            out = fn(self, node, *args, **kwargs)
        except Unsupported as e:
            self._unsupported(name, node, str(e))
            return Poison()
        if isinstance(out, Tensor) and out.name not in self.em.shape and hasattr(val, "shape"):
            self.em.shape[out.name] = self.dims(val)
            self.em.dtype.setdefault(out.name, np_dtype(val.dtype))
        return out

    def arg(self, a: Any) -> Any:
        if _is_fx(a):
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.arg(x) for x in a)
        if hasattr(a, "node") and hasattr(a.node, "expr"):  # a SymInt captured as a literal
            return self.expr(a)
        return a

    def _scalar_node(self, node: Any, name: str, val: Any) -> Any:
        if val is None:
            self._unsupported(name, node, "a scalar without a value")
            return Poison()
        try:
            if type(val).__name__ in ("SymInt", "int"):
                return self.expr(val, f"{node.name} ({name})")
            if type(val).__name__ in ("SymBool", "bool"):
                return bool(val) if type(val).__name__ == "bool" else _concrete(val)
            return float(val)
        except Unsupported as e:
            self._unsupported(name, node, str(e))
            return Poison()
        except Exception as e:  # a SymFloat / SymBool with no fixed value
            self._unsupported(name, node, f"a data-dependent scalar ({type(e).__name__})")
            return Poison()

    def _assert(self, node: Any, name: str) -> None:
        """torch's runtime asserts on sizes become dynshape facts, checked per call by the binder."""
        cond = node.args[0] if node.args else None
        val = self.meta(cond) if _is_fx(cond) else cond
        expr = getattr(getattr(val, "node", None), "expr", None)
        if expr is None:
            return
        msg = node.args[1] if len(node.args) > 1 else ""
        try:
            c = condition(expr, self.table, f"the assert at {node.name}")
        except Unsupported as e:
            self.notes.append(f"runtime assert {expr} ({msg}) not checked by dynshape: {e}")
            return
        if not isinstance(c, bool):
            self.facts.append((c, f"{c.text}", f"torch runtime assert {node.name}: {msg}".strip(": ")))

    def _fold(self, node: Any, name: str, args: list, kwargs: dict) -> Any:
        """Evaluate an op whose tensor inputs are all constants with torch itself."""
        if any(w in name for w in NO_FOLD) or "." not in name:
            return None
        flat = _flatten([args, list(kwargs.values())])
        tensors = [a for a in flat if isinstance(a, Tensor)]
        if not tensors or any(a.name not in self.em.inits for a in tensors) or any(is_expr(a) for a in flat):
            return None
        val = self.meta(node)
        outs = val if isinstance(val, (list, tuple)) else [val]
        if not all(hasattr(o, "shape") for o in outs):
            return None
        size = sum(int(np.prod([int(d) for d in o.shape])) for o in outs if all(isinstance(d, int) for d in o.shape))
        if size > FOLD_MAX_ELEMENTS:
            return None
        import torch

        def real(a: Any) -> Any:
            if isinstance(a, Tensor):
                return torch.from_numpy(np.ascontiguousarray(self.em.inits[a.name]))
            if isinstance(a, (list, tuple)):
                return type(a)(real(x) for x in a)
            return a

        try:
            with torch.no_grad(), warnings.catch_warnings():
                # the weights are read-only views (frozen_view); the graph is functional, nothing writes to them
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                res = node.target(*real(args), **{k: real(v) for k, v in kwargs.items()})
        except Exception:
            return None
        key_args = tuple(self.em.key[a.name] if isinstance(a, Tensor) else repr(a) for a in flat)
        results = res if isinstance(res, (list, tuple)) else [res]
        if not all(isinstance(r, torch.Tensor) for r in results):
            return None
        made = [self.em.const(to_numpy(r), key=("fold", name, key_args, i), hint=node.name)
                for i, r in enumerate(results)]
        return made if isinstance(res, (list, tuple)) else made[0]

    def _unsupported(self, name: str, node: Any, why: str | None) -> None:
        self.unsupported.setdefault(name, []).append(f"{node.name}" + (f": {why}" if why else ""))


_SIZE_OPS = {"sym_size.int", "sym_numel.default", "sym_stride.int", "sym_storage_offset.default"}
_ASSERTS = {"_assert_scalar.default", "_assert_async.msg", "sym_constrain_range_for_size.default",
            "sym_constrain_range.default", "_assert_tensor_metadata.default", "_assert_async.default"}


def _is_fx(a: Any) -> bool:
    return type(a).__name__ == "Node" and hasattr(a, "op") and hasattr(a, "target")


def _is_sym_scalar(v: Any) -> bool:
    """A node whose value is a size or a Python scalar (SymInt arithmetic, sym_size), not a tensor."""
    return type(v).__name__ in ("SymInt", "SymBool", "SymFloat") or isinstance(v, (bool, int, float))


def _concrete(v: Any) -> bool:
    from torch.fx.experimental.symbolic_shapes import guard_bool

    return bool(guard_bool(v))


def _flatten(x: Any) -> list:
    if isinstance(x, (list, tuple)):
        out: list = []
        for y in x:
            out.extend(_flatten(y))
        return out
    if isinstance(x, dict):
        return _flatten(list(x.values()))
    return [x]


def unsupported_error(found: dict[str, list[str]]) -> Unsupported:
    """One error naming every unconverted ATen op with its count and an example node (and why)."""
    parts = [f"{op} x{len(ns)} (e.g. {ns[0]})" for op, ns in sorted(found.items())]
    total = sum(len(v) for v in found.values())
    return Unsupported(f"{len(found)} ATen op(s) ({total} node(s)) have no dynshape lowering: " + "; ".join(parts))
