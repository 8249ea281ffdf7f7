"""ONNX frontend: `load_onnx` turns a ModelProto into a shape-inferred `ir.Graph`.

Everything that can be wrong with a model file is reported here as one `ModelError` naming the node, never as
a deep traceback from a later layer: unreadable bytes, cycles, dangling inputs, mistyped attributes, and (all
at once, with counts) the ops dynshape lacks.

Dims: a `dim_param` becomes the symbol of that name, so equal names are equal dims. Named dims default to
`min=0`: ONNX admits empty tensors (no detections, an empty batch, a zero-length past) and a model that runs
on them must run here too. What that costs is precision, never soundness: a broadcast of two undeclared dims
is `max(a, b) * min(a, b, 1)` rather than `max(a, b)` (0 against 1 gives 0), a division by a dim that may
be 0 gives a fresh dim tied to it by an equation, and fewer facts are provable. Declare `min=1` through
`dims` (or pass `default_min=1`) where a dim is never empty to get the simpler shapes back. Empty, '?' or
negative dims become fresh symbols named after their input and axis, with the same default.
"""

from __future__ import annotations

import collections
import heapq
import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, numpy_helper

import dynshape.ops  # noqa: F401  (defines every op in the IR's op table)
from dynshape.errors import DynshapeError, ModelError
from dynshape.frontends.onnx_checks import (
    check_arity,
    check_declared_outputs,
    check_flag,
    check_node_types,
    check_opsets,
    check_text,
    load_external_data,
    node_schema,
)
from dynshape.frontends.onnx_contrib import PERSISTED_ATTRS, PERSISTED_PREFIX, lower_contrib
from dynshape.frontends.onnx_fastread import read_direct
from dynshape.ir import opdef
from dynshape.ir.graph import Graph, Node, Value
from dynshape.ir.opdef import DEFAULT_DOMAIN, canonical_domain
from dynshape.ir.types import OptionalType, SequenceType, TensorType, ValueType


def load_onnx(model: Any, dims: Mapping[str, Any] | None = None, *, default_min: int = 0,
              infer: bool = True) -> Graph:
    """Load an ONNX model (path, bytes or ModelProto) and run shape inference on it.

    `dims` declares the model's named dims: `{"batch": (1, 64), "seq": {"min": 1, "max": 512,
    "multiple_of": 8}, "heads": 12, "h": ds.sym("h", multiple_of=32)}` (a tuple is (min, max); an int fixes
    the dim). `infer=False` returns the graph without types (for tools that only want the structure).
    """
    proto, direct = _read_direct(model)
    opsets = check_opsets(proto)
    symbols = _Symbols(dims or {}, default_min)
    conv = _Converter(opsets, {(f.domain, f.name): f for f in proto.functions}, symbols, direct)
    graph = conv.graph(proto.graph, outer=frozenset(), top=True)
    symbols.check_all_used()
    lower_contrib(graph)
    _check_supported(graph)
    graph.signature.defaulted = frozenset(symbols.defaulted)
    if infer:
        from dynshape.ir.infer import infer_graph

        infer_graph(graph)
        check_node_types(graph)
        check_declared_outputs(proto, graph.types)
    return graph


def read_model(path: str | os.PathLike) -> onnx.ModelProto:
    """The ModelProto at `path`, external data read safely from the model's folder (see onnx_checks)."""
    return _read(os.fspath(path))


# ---- reading -------------------------------------------------------------------------------------------
def _read_direct(model: Any) -> tuple[onnx.ModelProto, dict[int, np.ndarray]]:
    """The model, and the top graph's large initializers already as arrays (by index) where the file could be
    read that way (onnx_fastread); otherwise the whole ModelProto and no arrays."""
    if isinstance(model, (str, os.PathLike)) and os.path.isfile(os.fspath(model)):
        path = os.fspath(model)
        got = read_direct(path)
        if got is not None:
            load_external_data(got[0], os.path.dirname(os.path.abspath(path)))  # Constant attributes may have some
            return _check_graph(got[0]), got[1]
    return _read(model), {}


def _read(model: Any) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (bytes, bytearray)):
        proto = _parse(bytes(model), "the given bytes")
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise ModelError(f"no ONNX model at {path!r} (file not found)")
        try:
            proto = onnx.load(path, load_external_data=False)
        except Exception as e:  # protobuf DecodeError, ...
            raise ModelError(f"cannot read {path!r}: {_short(e)}; the file is truncated or not an ONNX model") \
                from None
        load_external_data(proto, os.path.dirname(os.path.abspath(path)))
        return _check_graph(proto)
    else:
        raise ModelError(f"load_onnx expects a path, bytes or onnx.ModelProto, got {type(model).__name__}")
    load_external_data(proto, None)
    return _check_graph(proto)


def _check_graph(proto: onnx.ModelProto) -> onnx.ModelProto:
    check_text(proto)
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise ModelError("the model has no graph (empty or not an ONNX file)")
    if not proto.graph.output:
        raise ModelError(f"graph {proto.graph.name!r} declares no outputs: a model must name at least one (onnx's "
                         "checker and onnxruntime refuse it)")
    return proto


def _parse(data: bytes, what: str) -> onnx.ModelProto:
    try:
        return onnx.load_from_string(data)
    except Exception as e:
        raise ModelError(f"cannot parse {what}: {_short(e)}; truncated or not an ONNX model") from None


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]


# ---- symbols -------------------------------------------------------------------------------------------
def _persisted(p: onnx.NodeProto, label: str) -> dict[str, list[float]]:
    """The private attributes a dynshape save wrote as node metadata (onnx_contrib.PERSISTED_ATTRS): lists of
    finite floats; anything else under that prefix is refused by name, never half-read."""
    got: dict[str, list[float]] = {}
    for m in p.metadata_props:
        if not m.key.startswith(PERSISTED_PREFIX):
            continue
        k = m.key[len(PERSISTED_PREFIX):]
        try:
            v = json.loads(m.value) if k in PERSISTED_ATTRS else None
            ok = isinstance(v, list) and bool(v) and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)
        except ValueError:
            ok = False
        if not ok:
            raise ModelError(f"{label}: metadata {m.key!r} is not a dynshape attribute this version reads "
                             f"(known: {', '.join(PERSISTED_PREFIX + a for a in PERSISTED_ATTRS)}, "
                             "each a JSON list of finite numbers)")
        got[k] = [float(x) for x in v]
    return got


class _Symbols:
    """dim_param name -> symbol, honouring the user's `dims` declarations."""

    def __init__(self, dims: Mapping[str, Any], default_min: int):
        self.decl = dict(dims)
        self.default_min = default_min
        self.made: dict[str, Any] = {}
        self.defaulted: set[str] = set()  # names that got the default range (no declaration)

    def named(self, name: str) -> Any:
        if name not in self.made:
            self.made[name] = self._make(name, self.decl.get(name))
        return self.made[name]

    def anonymous(self, hint: str) -> Any:
        name, i = hint, 1
        while name in self.made or name in self.decl:
            i += 1
            name = f"{hint}_{i}"
        return self.named(name)

    def _make(self, name: str, d: Any) -> Any:
        from dynshape.sym import is_expr, sym

        try:
            if d is None:
                self.defaulted.add(name)
                return sym(name, min=self.default_min)
            if is_expr(d):
                return d
            if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
                return int(d)
            if isinstance(d, tuple) and len(d) == 2:
                return sym(name, min=d[0], max=d[1])
            if isinstance(d, Mapping):
                extra = set(d) - {"min", "max", "multiple_of"}
                if extra:
                    raise ModelError(f"dims[{name!r}] has unknown keys {sorted(extra)}; use min, max, multiple_of")
                return sym(name, min=d.get("min", self.default_min), max=d.get("max"),
                           multiple_of=d.get("multiple_of", 1))
        except DynshapeError as e:
            if isinstance(e, ModelError):
                raise
            raise ModelError(f"dims[{name!r}] = {d!r} is not a valid declaration: {e}") from None
        raise ModelError(f"dims[{name!r}] = {d!r}: expected (min, max), {{'min','max','multiple_of'}}, an int "
                         "or a ds.sym")

    def check_all_used(self) -> None:
        unused = sorted(set(self.decl) - set(self.made))
        if unused:
            have = sorted(n for n in self.made if n not in self.decl) or ["none"]
            raise ModelError(f"dims declares {unused}, which the model's inputs do not use "
                             f"(its named dims: {', '.join(have)})")


# ---- conversion ----------------------------------------------------------------------------------------
class _Converter:
    def __init__(self, opsets: dict[str, int], functions: dict, symbols: _Symbols,
                 direct: dict[int, np.ndarray] | None = None):
        self.opsets = opsets
        self.direct = direct or {}  # top graph initializers read straight from the file, by index
        self.functions = functions
        self.symbols = symbols
        self.used_names: set[str] = set()

    def graph(self, gp: onnx.GraphProto, outer: frozenset, top: bool = False) -> Graph:
        """Convert one (sub)graph; `outer` holds the names visible from enclosing graphs."""
        inits: dict[str, np.ndarray] = {}
        for i, t in enumerate(gp.initializer):
            got = self.direct.get(i) if top else None
            inits[t.name] = got if got is not None else self._tensor(t, f"initializer {t.name!r}")
        for st in gp.sparse_initializer:
            inits[st.values.name] = _sparse_to_dense(st)
        inputs = [self._value(vi, top) for vi in gp.input if vi.name not in inits]
        protos = self._inline(list(gp.node), prefix="")
        names = {*(v.name for v in inputs), *inits}
        produced: dict[str, int] = {}
        for i, np_ in enumerate(protos):
            for o in np_.output:
                if not o:
                    continue
                if o in produced or o in names:
                    raise ModelError(f"value {o!r} is produced twice (by {self._node_name(np_, i)!r} and earlier); "
                                     "every value must have one producer")
                produced[o] = i
        visible = outer | names | produced.keys()
        nodes = [self._node(p, i, visible) for i, p in enumerate(protos)]
        nodes = _toposort(nodes, produced, names | outer)
        outputs = []
        for vi in gp.output:
            if vi.name not in visible:
                raise ModelError(f"graph {gp.name!r} output {vi.name!r} is produced by no node and is not an input")
            outputs.append(self._value(vi, False, declared_only=True))
        overridable = tuple(vi.name for vi in gp.input if vi.name in inits) if top else ()
        return Graph(gp.name or "main", inputs, outputs, nodes, inits, {}, opset_imports=dict(self.opsets),
                     overridable=overridable)

    def _value(self, vi: onnx.ValueInfoProto, top: bool, declared_only: bool = False) -> Value:
        """A graph input/output. Top-level input dims become symbols; elsewhere, undeclared dims stay None."""
        t = self._type(vi.type, vi.name, top, declared_only)
        if t is None:
            if top:
                raise ModelError(f"graph input {vi.name!r} has no type; dynshape needs dtype and rank")
            return Value(vi.name, np.dtype(np.float32), None)
        return Value.of(vi.name, t)

    def _type(self, tp: onnx.TypeProto, name: str, top: bool, declared_only: bool) -> ValueType | None:
        which = tp.WhichOneof("value")
        if which == "tensor_type":
            tt = tp.tensor_type
            if tt.elem_type == 0:
                if top:
                    raise ModelError(f"input {name!r} has no element type")
                return None
            dtype = _dtype(tt.elem_type, f"value {name!r}")
            if not tt.HasField("shape"):
                if top:
                    raise ModelError(f"graph input {name!r} has no shape; dynshape needs at least its rank "
                                     "(use dim_param names for the dynamic dims)")
                return TensorType(dtype, None)  # rank unknown: only the owning op can say
            return TensorType(dtype, tuple(self._dim(d, name, ax, top, declared_only)
                                           for ax, d in enumerate(tt.shape.dim)))
        if which == "sequence_type":
            inner = self._type(tp.sequence_type.elem_type, name, False, True)
            if not isinstance(inner, TensorType):
                raise ModelError(f"value {name!r}: only sequences of tensors are supported")
            if inner.shape is not None and all(isinstance(d, int) for d in inner.shape):
                return SequenceType(inner.dtype, inner.shape)
            # named or unknown element dims may differ between elements: keep only the rank
            return SequenceType(inner.dtype, None, None if inner.shape is None else len(inner.shape))
        if which == "optional_type":
            # a top-level optional tensor's dims are input dims like any other (symbols, bound when fed)
            inner = self._type(tp.optional_type.elem_type, name, top, not top)
            if inner is None:
                raise ModelError(f"value {name!r}: optional without an element type")
            return OptionalType(inner)
        if which is None:
            return None
        raise ModelError(f"value {name!r} has type {which}, which dynshape does not support")

    def _dim(self, d: Any, name: str, axis: int, top: bool, declared_only: bool) -> Any:
        if d.HasField("dim_value") and d.dim_value >= 0:
            return int(d.dim_value)
        if not top:
            return d.dim_param if declared_only and d.dim_param else None
        param = d.dim_param.strip()
        if param and param != "?":
            return self.symbols.named(param)
        return self.symbols.anonymous(re.sub(r"\W", "_", f"{name}_{axis}"))

    def _tensor(self, t: onnx.TensorProto, what: str) -> np.ndarray:
        if any(d < 0 for d in t.dims):  # numpy would read -1 as "infer this dim"
            raise ModelError(f"{what}: dims {list(t.dims)} has a negative entry")
        try:
            return numpy_helper.to_array(t)
        except Exception as e:
            raise ModelError(f"{what}: cannot decode tensor data ({_short(e)})") from None

    # ---- nodes -----------------------------------------------------------------------------------------
    def _node_name(self, p: onnx.NodeProto, i: int) -> str:
        return p.name or f"{p.op_type}_{i}"

    def _node(self, p: onnx.NodeProto, i: int, visible: set) -> Node:
        name = self._node_name(p, i)
        base, k = name, 1
        while name in self.used_names:  # unique names keep every error message unambiguous
            k += 1
            name = f"{base}_{k}"
        self.used_names.add(name)
        domain = canonical_domain(p.domain)  # the one place a proto's domain spelling is read
        label = f"node {name!r} ({p.op_type})"
        for x in p.input:
            if x and x not in visible:
                raise ModelError(f"{label} reads {x!r}, which no node produces and which is neither a graph "
                                 "input nor an initializer (dangling input)")
        schema = node_schema(p.op_type, domain, self.opsets.get(domain, 1), label)
        if schema is not None:
            check_arity(p, schema, label)
        attrs = {}
        for a in p.attribute:
            attrs[a.name] = self._attr(a, label, schema, visible)
            if schema is not None:
                check_flag(a.name, attrs[a.name], label)
        if schema is not None:
            missing = sorted(k for k, spec in schema.attributes.items() if spec.required and k not in attrs)
            if missing:
                raise ModelError(f"{label}: missing required attribute(s) {', '.join(map(repr, missing))}")
        attrs.update(_persisted(p, label))
        return Node(p.op_type, domain, name, attrs, list(p.input), list(p.output))

    def _attr(self, a: AttributeProto, label: str, schema: Any, visible: set) -> Any:
        if a.ref_attr_name:
            raise ModelError(f"{label}: attribute {a.name!r} refers to {a.ref_attr_name!r} outside a function")
        if schema is not None:
            spec = schema.attributes.get(a.name)
            if spec is None:
                known = ", ".join(sorted(schema.attributes)) or "none"
                raise ModelError(f"{label}: unknown attribute {a.name!r} (this op's attributes: {known})")
            want = int(spec.type.value)
            if a.type != want:
                raise ModelError(f"{label}: attribute {a.name!r} has type {_attr_type(a.type)}, "
                                 f"expected {_attr_type(want)}")
        t = a.type
        if t == AttributeProto.FLOAT:
            return float(a.f)
        if t == AttributeProto.INT:
            return int(a.i)
        if t == AttributeProto.STRING:
            return a.s.decode("utf-8", "replace")
        if t == AttributeProto.TENSOR:
            return self._tensor(a.t, f"{label} attribute {a.name!r}")
        if t == AttributeProto.SPARSE_TENSOR:
            return _sparse_to_dense(a.sparse_tensor)
        if t == AttributeProto.GRAPH:
            return self.graph(a.g, frozenset(visible))
        if t == AttributeProto.TYPE_PROTO:
            return self._type(a.tp, a.name, False, True)
        if t == AttributeProto.FLOATS:
            return [float(x) for x in a.floats]
        if t == AttributeProto.INTS:
            return [int(x) for x in a.ints]
        if t == AttributeProto.STRINGS:
            return [s.decode("utf-8", "replace") for s in a.strings]
        if t == AttributeProto.TENSORS:
            return [self._tensor(x, f"{label} attribute {a.name!r}") for x in a.tensors]
        if t == AttributeProto.GRAPHS:
            return [self.graph(g, frozenset(visible)) for g in a.graphs]
        raise ModelError(f"{label}: attribute {a.name!r} has no usable type ({_attr_type(t)})")

    # ---- model-local functions -------------------------------------------------------------------------
    def _inline(self, protos: list, prefix: str, depth: int = 0) -> list:
        """Replace calls of model-local functions by their bodies (values renamed under the call's name)."""
        if not self.functions:
            return protos
        out = []
        for i, p in enumerate(protos):
            f = self.functions.get((p.domain, p.op_type))
            if f is None or (canonical_domain(p.domain) == DEFAULT_DOMAIN and opdef.lookup(p.op_type) is not None):
                out.append(p)
                continue
            if depth > 32:
                raise ModelError(f"function {p.op_type!r} calls itself recursively")
            out.extend(self._inline(_expand_call(p, f, f"{prefix}{self._node_name(p, i)}/"), prefix, depth + 1))
        return out


def _expand_call(call: onnx.NodeProto, f: onnx.FunctionProto, prefix: str) -> list:
    rename = {formal: actual for formal, actual in zip(f.input, call.input)}
    rename.update({formal: "" for formal in list(f.input)[len(call.input):]})
    rename.update({formal: actual for formal, actual in zip(f.output, call.output)})
    attrs = {a.name: a for a in f.attribute_proto}
    attrs.update({a.name: a for a in call.attribute})
    body = []
    for n in f.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.name = prefix + (n.name or n.op_type)
        for k, x in enumerate(m.input):
            m.input[k] = rename.get(x, prefix + x if x else x)
        for k, x in enumerate(m.output):
            m.output[k] = rename.get(x, prefix + x if x else x)
        kept = []
        for a in m.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name not in attrs:
                    continue  # optional attribute the call leaves unset
                b = onnx.AttributeProto()
                b.CopyFrom(attrs[a.ref_attr_name])
                b.name = a.name
                a = b
            kept.append(a)
        del m.attribute[:]
        m.attribute.extend(kept)
        body.append(m)
    return body


# ---- helpers -------------------------------------------------------------------------------------------
def _toposort(nodes: list[Node], produced: dict[str, int], sources: set) -> list[Node]:
    """Stable topological order (original order where possible); a cycle is a ModelError naming its nodes."""
    deps: list[set[int]] = []
    for n in nodes:
        needed = set(n.inputs) | n.free_names()
        deps.append({produced[x] for x in needed if x in produced})
    users: dict[int, list[int]] = collections.defaultdict(list)
    indeg = [0] * len(nodes)
    for i, ds in enumerate(deps):
        indeg[i] = len(ds)
        for d in ds:
            users[d].append(i)
    ready = [i for i, k in enumerate(indeg) if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = [nodes[i].name for i in range(len(nodes)) if indeg[i] > 0]
        raise ModelError(f"the graph has a cycle through nodes {stuck[:8]}{'...' if len(stuck) > 8 else ''}")
    return [nodes[i] for i in order]


def _attr_type(t: int) -> str:
    try:
        return AttributeProto.AttributeType.Name(t)
    except ValueError:
        return f"type {t}"


def _dtype(elem_type: int, what: str) -> np.dtype:
    from dynshape.ops.dtypes import np_dtype

    try:
        return np_dtype(elem_type)
    except Exception:
        raise ModelError(f"{what}: unsupported element type {elem_type}") from None


def _sparse_to_dense(st: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(st.values)
    idx = numpy_helper.to_array(st.indices) if st.HasField("indices") else np.zeros((0,), np.int64)
    dense = np.zeros(tuple(st.dims), dtype=values.dtype)
    if idx.ndim == 1:
        dense.reshape(-1)[idx] = values
    else:
        dense[tuple(idx.T)] = values
    return dense


def _check_supported(graph: Graph) -> None:
    """One ModelError listing every op dynshape lacks, with counts and an example node each."""
    missing: dict[str, list[str]] = {}

    def walk(g: Graph) -> None:
        for n in g.nodes:
            if opdef.lookup(n.op_type, n.domain) is None:
                key = f"{n.domain}::{n.op_type}" if n.domain else n.op_type
                missing.setdefault(key, []).append(n.name)
            for sub in n.subgraphs():
                walk(sub)

    walk(graph)
    if missing:
        parts = [f"{op} x{len(ns)} (e.g. node {ns[0]!r})" for op, ns in sorted(missing.items())]
        raise ModelError(f"the model uses {len(missing)} op type(s) dynshape does not support: " + "; ".join(parts))
