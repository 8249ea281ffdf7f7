"""What the ONNX checker validates, as `ModelError`s naming the node: the checks `load_onnx` runs before converting.

Why not `onnx.checker.check_model` alone: it stops at the first problem with a message that names no node and
no fix, it rejects graphs dynshape reads fine (nodes out of topological order), and it cannot see what only
inference knows (a declared output dtype that disagrees with the computed one). So the checks that matter for a
model's meaning are here, each with the node and the fix:
- opset imports: a default-domain import exists when default-domain ops are used, and is a real version;
- every op exists at the imported opset (Gelu needs opset 20) and is not deprecated there (Upsample after 9);
- node arity: the number of inputs and outputs is within the schema's bounds, and no required input is empty
  (`TopK` with an empty K, `Add` with one input, extra inputs that would be silently ignored);
- external data: only for a model given as a path, resolved in the model's folder, never `..`, an absolute
  location or a link that leaves it, and only from regular files; a model given as bytes or a ModelProto that
  still points at external files is refused (it has no folder to resolve them in);
- the declared output dtypes agree with inference (checked after it, `check_declared_outputs`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto

from dynshape.errors import ModelError
from dynshape.ir.opdef import DEFAULT_DOMAIN, canonical_domain
from dynshape.ir.types import TensorType
from dynshape.ops.dtypes import np_dtype

MAX_OPSET = onnx.defs.onnx_opset_version()
STANDARD_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training")
_SCHEMAS: dict = {}


# ---- text fields ------------------------------------------------------------------------------------------
def check_text(proto: Any, where: str = "the model") -> None:
    """Every string field is text: protobuf hands a proto2 string that is not UTF-8 back as bytes (a corrupted
    file), which no later layer expects in a name or an op type.

    Walks the string and message fields the descriptor declares, never `ListFields`: that hands every set
    field to Python, a tensor's `raw_data` included, which copied VGG-19's 548 MB of weights (0.3 s a load)."""
    stack = [(proto, where)]
    while stack:
        msg, at = stack.pop()
        for name, is_message, repeated in _text_fields(msg.DESCRIPTOR):
            if is_message:
                if repeated:
                    items = getattr(msg, name)
                elif msg.HasField(name):
                    items = [getattr(msg, name)]
                else:
                    continue
                if items:
                    label = f"{at} > {name}"
                    stack.extend((m, label) for m in items)
                continue
            for v in (getattr(msg, name) if repeated else [getattr(msg, name)]):
                if not isinstance(v, str):
                    raise ModelError(f"{at}: field {name!r} holds bytes that are not UTF-8 text "
                                     f"({bytes(v)[:40]!r}); the file is corrupted")


_TEXT_FIELDS: dict[Any, tuple[tuple[str, bool, bool], ...]] = {}


def _text_fields(descriptor: Any) -> tuple[tuple[str, bool, bool], ...]:
    """(name, is a message, is repeated) of a message type's string and message fields, once per type."""
    fields = _TEXT_FIELDS.get(descriptor)
    if fields is None:
        from google.protobuf.descriptor import FieldDescriptor

        kinds = {FieldDescriptor.TYPE_STRING: False, FieldDescriptor.TYPE_MESSAGE: True}
        fields = tuple((fd.name, kinds[fd.type], _repeated(fd)) for fd in descriptor.fields if fd.type in kinds)
        _TEXT_FIELDS[descriptor] = fields
    return fields


def _repeated(fd: Any) -> bool:
    """Whether a field is repeated, across protobuf versions (`is_repeated` since 5.x, `label` before)."""
    if hasattr(fd, "is_repeated"):
        return bool(fd.is_repeated)
    return fd.label == fd.LABEL_REPEATED


# ---- boolean attributes -------------------------------------------------------------------------------------
# int attributes ONNX defines as flags: any other value is read differently by different runtimes (onnxruntime's
# TopK takes largest == 1, its Gemm transB != 0), so a value other than 0 or 1 is refused, never guessed
FLAGS = frozenset({
    "keepdims", "noop_with_empty_axes", "transA", "transB", "largest", "sorted", "exclusive", "reverse", "ceil_mode",
    "count_include_pad", "storage_order", "training_mode", "select_last_index", "allowzero", "detect_negative",
    "detect_positive", "upper", "linear_before_reset", "input_forget", "is_case_sensitive", "new_axis",
    "exclude_outside", "align_corners", "fmod", "saturate", "onesided", "inverse", "center_point_box", "is_causal",
    "antialias"})


DTYPE_ATTRS = {"to": False, "dtype": True, "output_dtype": True}  # name -> whether 0 (the default) is allowed


def check_flag(name: str, value: Any, label: str) -> None:
    """Flags are 0 or 1; element-type attributes (Cast's `to`, `dtype`) name a type dynshape knows."""
    if name in FLAGS and isinstance(value, int) and value not in (0, 1):
        raise ModelError(f"{label}: attribute {name!r} = {value} is a flag and must be 0 or 1")
    if name in DTYPE_ATTRS and isinstance(value, int) and not (value == 0 and DTYPE_ATTRS[name]):
        try:
            np_dtype(value)
        except Exception:
            raise ModelError(f"{label}: attribute {name!r} = {value} is not an ONNX element type "
                             "(TensorProto.DataType)") from None


# ---- opsets and schemas ---------------------------------------------------------------------------------
def check_opsets(proto: onnx.ModelProto) -> dict[str, int]:
    """The model's opset imports by domain ('' for ai.onnx), refused when missing or not a real version."""
    if proto.ir_version > onnx.IR_VERSION:
        raise ModelError(f"the model has IR version {proto.ir_version}, newer than this onnx reads "
                         f"({onnx.IR_VERSION}); export it with an older IR version")
    if 0 < proto.ir_version < 4:
        listed = {i.name for i in proto.graph.input}
        unlisted = [t.name for t in proto.graph.initializer if t.name not in listed]
        if unlisted:
            raise ModelError(f"the model has IR version {proto.ir_version}, where every initializer must also be a "
                             f"graph input; {unlisted[0]!r} is not (re-export with IR version >= 4)")
    opsets: dict[str, int] = {}
    for o in proto.opset_import:
        domain = canonical_domain(o.domain)
        if domain in opsets:
            raise ModelError(f"the model imports domain {o.domain or 'ai.onnx'!r} twice; import each domain once")
        if o.version < 1:
            raise ModelError(f"the model imports {o.domain or 'ai.onnx'} opset {o.version}; opset versions start "
                             "at 1")
        if domain == "" and o.version > MAX_OPSET:
            raise ModelError(f"the model imports ai.onnx opset {o.version}, newer than any this dynshape knows "
                             f"({MAX_OPSET}); export it at opset {MAX_OPSET} or lower")
        opsets[domain] = int(o.version)
    if "" not in opsets:
        if _uses_default_domain(proto.graph) or any(_uses_default_domain_nodes(f.node) for f in proto.functions):
            raise ModelError("the model uses ai.onnx ops but imports no ai.onnx opset; add an opset_import for "
                             f"domain '' (e.g. helper.make_opsetid('', {MAX_OPSET}))")
        opsets[""] = MAX_OPSET
    return opsets


def _uses_default_domain_nodes(nodes: Any) -> bool:
    return any(canonical_domain(n.domain) == DEFAULT_DOMAIN for n in nodes)


def _uses_default_domain(g: onnx.GraphProto) -> bool:
    if _uses_default_domain_nodes(g.node):
        return True
    return any(_uses_default_domain(sub) for n in g.node for a in n.attribute
               for sub in ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)))


def node_schema(op_type: str, domain: str, version: int, label: str) -> Any:
    """The op's schema at the imported opset (None for ops outside ONNX's standard domains or unknown to it).

    An ONNX op used below the opset that introduced it, or at one that deprecates it, is a ModelError: onnx's
    checker and onnxruntime refuse such models, and running them would give the op a meaning the model never
    had."""
    if domain not in STANDARD_DOMAINS:
        return None
    key = (op_type, domain, version)
    if key in _SCHEMAS:
        schema = _SCHEMAS[key]
    else:
        try:
            schema = onnx.defs.get_schema(op_type, min(version, MAX_OPSET), domain)
        except Exception:  # onnx's SchemaError: no version of the op at or below this opset
            schema = None
        _SCHEMAS[key] = schema
    if schema is None:
        if onnx.defs.has(op_type, domain):
            first = onnx.defs.get_schema(op_type, MAX_OPSET, domain)
            while True:  # the oldest version: walk down from the newest
                try:
                    first = onnx.defs.get_schema(op_type, first.since_version - 1, domain)
                except Exception:
                    break
            raise ModelError(f"{label}: {op_type} does not exist at {domain or 'ai.onnx'} opset {version} (it was "
                             f"introduced at opset {first.since_version}); import opset >= {first.since_version} "
                             "or use the ops of your opset")
        return None
    if schema.deprecated:
        raise ModelError(f"{label}: {op_type} is deprecated at {domain or 'ai.onnx'} opset {version} (since opset "
                         f"{schema.since_version}); onnxruntime and onnx's checker refuse it: use its replacement "
                         "(Upsample -> Resize) or an older opset")
    return schema


def check_arity(p: onnx.NodeProto, schema: Any, label: str) -> None:
    """Input and output counts within the schema's bounds, and no required (non-optional) input empty."""
    n_in, n_out = len(p.input), len(p.output)
    if not schema.min_input <= n_in <= schema.max_input:
        raise ModelError(f"{label} has {n_in} input(s); {p.op_type} takes {_range(schema.min_input, schema.max_input)}"
                         f" ({_formals(schema.inputs)})")
    if not schema.min_output <= n_out <= schema.max_output:
        raise ModelError(f"{label} has {n_out} output(s); {p.op_type} gives "
                         f"{_range(schema.min_output, schema.max_output)} ({_formals(schema.outputs)})")
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for i, (formal, x) in enumerate(zip(schema.inputs, p.input)):
        if not x and formal.option == single:
            raise ModelError(f"{label}: input {i} ({formal.name!r}) is required but left empty")
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    if schema.inputs and schema.inputs[-1].option == variadic:
        k = len(schema.inputs) - 1
        empty = [i for i, x in enumerate(p.input) if i >= k and not x]
        if empty:
            raise ModelError(f"{label}: input {empty[0]} (of the variadic {schema.inputs[-1].name!r}) is empty")
    if not any(p.output):
        raise ModelError(f"{label}: every output name is empty; the node computes nothing the graph can use")


def _range(lo: int, hi: int) -> str:
    if lo == hi:
        return f"exactly {lo}"
    return f"at least {lo}" if hi >= 2**31 - 1 else f"{lo} to {hi}"


def _formals(params: Any) -> str:
    names = {"Single": "", "Optional": " (optional)", "Variadic": "..."}
    return ", ".join(f"{f.name}{names.get(f.option.name, '')}" for f in params) or "none"


# ---- external data -----------------------------------------------------------------------------------------
def tensors(proto: onnx.ModelProto) -> Iterator[TensorProto]:
    """Every TensorProto of the model: initializers, sparse ones, attribute tensors, in subgraphs and functions."""

    def graph(g: onnx.GraphProto) -> Iterator[TensorProto]:
        yield from g.initializer
        for st in g.sparse_initializer:
            yield st.values
            yield st.indices
        yield from nodes(g.node)

    def nodes(ns: Any) -> Iterator[TensorProto]:
        for n in ns:
            for a in n.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
                if a.HasField("sparse_tensor"):
                    yield a.sparse_tensor.values
                    yield a.sparse_tensor.indices
                if a.HasField("g"):
                    yield from graph(a.g)
                for sub in a.graphs:
                    yield from graph(sub)

    yield from graph(proto.graph)
    for f in proto.functions:
        yield from nodes(f.node)


def load_external_data(proto: onnx.ModelProto, base_dir: str | None) -> None:
    """Read every external tensor's data from the model's folder (in place), or refuse: no folder (bytes or a
    ModelProto), a location outside the folder (absolute, `..`, a link leaving it), or not a regular file."""
    external = [t for t in tensors(proto) if t.data_location == TensorProto.EXTERNAL]
    if not external:
        return
    if base_dir is None:
        t = external[0]
        raise ModelError(f"tensor {t.name!r} keeps its data in an external file ({_location(t)!r}), but the model was "
                         "given as bytes or a ModelProto, which have no folder to find it in: pass the model's path "
                         "(external data is read from the model's folder), or load it with onnx.load(path) first")
    root = Path(base_dir).resolve()
    for t in external:
        loc = _location(t)
        what = f"tensor {t.name!r}: external data location {loc!r}"
        if not loc or os.path.isabs(loc) or ".." in Path(loc).parts:
            raise ModelError(f"{what} is not a plain relative path inside the model's folder; external data is only "
                             "read from beside the model (no absolute paths, no '..')")
        path = (root / loc).resolve()
        if root not in path.parents:
            raise ModelError(f"{what} resolves to {str(path)!r}, outside the model's folder {str(root)!r} (a link?); "
                             "refusing to read it")
        if not path.is_file():
            raise ModelError(f"{what}: {'no such file' if not path.exists() else 'not a regular file'} in "
                             f"{str(root)!r}; put the data file beside the model")
        try:
            onnx.external_data_helper.load_external_data_for_tensor(t, str(root))
        except Exception as e:  # offset/length past the end of the file, unreadable, ...
            raise ModelError(f"{what}: cannot read it ({type(e).__name__}: {str(e).splitlines()[0][:160]})") from None


def _location(t: TensorProto) -> str:
    return next((e.value for e in t.external_data if e.key == "location"), "")


# ---- after inference ---------------------------------------------------------------------------------------
def check_declared_outputs(proto: onnx.ModelProto, types: dict) -> None:
    """A graph output declared with one element type that inference computes as another is a broken model
    (onnxruntime refuses it); report it instead of returning data of a dtype the caller does not expect."""
    for vi in proto.graph.output:
        tt = vi.type.tensor_type if vi.type.WhichOneof("value") == "tensor_type" else None
        t = types.get(vi.name)
        if tt is None or tt.elem_type == 0 or not isinstance(t, TensorType):
            continue
        try:
            declared = np.dtype(np_dtype(tt.elem_type))
        except Exception:
            continue
        if declared != np.dtype(t.dtype):
            raise ModelError(f"graph output {vi.name!r} is declared {declared} but the model computes "
                             f"{np.dtype(t.dtype)}; fix the output's declared type (or add a Cast)")


# ---- input element types against the schema's type constraints ----------------------------------------------
def _onnx_type_names() -> dict[np.dtype, str]:
    out: dict[np.dtype, str] = {}
    for name, code in TensorProto.DataType.items():
        if code == 0:
            continue
        try:
            out.setdefault(np.dtype(np_dtype(code)), name.lower())
        except Exception:  # a code this onnx has no numpy type for
            continue
    return out


_TYPE_NAMES: dict[np.dtype, str] = {}


def check_node_types(graph: Any, scope: dict | None = None) -> None:
    """Every node's tensor inputs have element types its schema allows (`Softmax` of strings, `Add` of float and
    int64), and inputs sharing a type parameter agree: what onnxruntime checks before it runs anything. A model
    that breaks this is a ModelError naming the node, the input and the types allowed."""
    if not _TYPE_NAMES:
        _TYPE_NAMES.update(_onnx_type_names())
    types = {**(scope or {}), **graph.types}
    for node in graph.nodes:
        domain = node.domain
        schema = node_schema(node.op_type, domain, graph.opset_imports.get(domain, 1), node.label()) \
            if domain in STANDARD_DOMAINS else None
        if schema is not None:
            _check_types(node, schema, types)
        for sub in node.subgraphs():
            check_node_types(sub, types)


def _check_types(node: Any, schema: Any, types: dict) -> None:
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    formals = list(schema.inputs)
    if not formals:
        return
    seen: dict[str, tuple[str, str]] = {}  # type parameter -> (element type, input) first bound
    for i, x in enumerate(node.inputs):
        t = types.get(x) if x else None
        if not isinstance(t, TensorType):
            continue
        formal = formals[min(i, len(formals) - 1)]
        allowed = constraints.get(formal.type_str, {formal.type_str})
        tensor_types = {a[len("tensor("):-1] for a in allowed if a.startswith("tensor(")}
        name = _TYPE_NAMES.get(np.dtype(t.dtype))
        if name is None or not tensor_types:
            continue
        if name not in tensor_types:
            raise ModelError(f"{node.label()}: input {i} ({formal.name!r} = {x!r}) is a tensor of {name}, which "
                             f"{node.op_type} does not take (allowed: {', '.join(sorted(tensor_types))})")
        if formal.type_str in constraints and formal.is_homogeneous:
            first = seen.setdefault(formal.type_str, (name, x))
            if first[0] != name:
                raise ModelError(f"{node.label()}: inputs {first[1]!r} ({first[0]}) and {x!r} ({name}) must have the "
                                 f"same element type ({formal.type_str}); add a Cast")
