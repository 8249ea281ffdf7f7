"""Statically quantized models into int8 products: QDQ graphs (`precision="int8"`) and QLinearMatMul (always).

A QDQ model (what onnxruntime's `quantize_static` writes with QuantFormat.QDQ) keeps float ops and marks where
values are quantized: every activation passes through QuantizeLinear -> DequantizeLinear, every weight is an int8
initializer behind a DequantizeLinear, so a product reads

    y = MatMul(DequantizeLinear(QuantizeLinear(x, sx, zx), sx, zx), DequantizeLinear(W, sw, zw))

Run as written that is float32 arithmetic on dequantized values; `fuse_qdq` (under `precision="int8"`) makes each
such MatMul (and Gemm: alpha 1, no transA; its bias an Add after) one `dynshape::QuantizedMatMul(x, sx, zx, W', zw',
sx * sw)` (ops/qstatic.py): x quantized inside the kernel, (q - zx)(W - zw) summed exactly in int32, one float32
multiply per element (codegen/lower/qproduct.py). Not bit-exact with the float graph, whose dot products round at
every step: the int8 sums are exact, so the two differ by the float graph's own rounding (about 1e-6 of the result's
magnitude), and a QuantizeLinear after the product may then land on the neighbouring integer where the float value
sits within that distance of a rounding boundary. Hence opt-in. The weights are per tensor or per output column
(per-channel quantization, axis 1 of MatMul's (k, n), axis 0 of a transB Gemm's (n, k)); the activation per tensor.
An activation that arrives already quantized (an 8-bit graph input behind a DequantizeLinear) is read as it is.

The remaining QuantizeLinear -> DequantizeLinear pairs (per tensor, 8-bit) become `dynshape::QuantizeDequantize`,
one elementwise op that fuses into its neighbours' kernels (a product's epilogue, a softmax's input) instead of two
reference steps and an 8-bit tensor in between; it equals the pair for every finite value.

`fuse_qlinear` (every build, as passes/quant.py's dynamic chains: exact) makes each `QLinearMatMul` by a constant
8-bit matrix with per-tensor activation parameters a `QuantizedMatMul` with y_zero_point, whose kernel requantizes in
its epilogue exactly as the ONNX reference does (float64 product of the int32 sum and the float32 multiplier
a_scale * b_scale / y_scale, rounded half to even, saturated).

The rewrite runs before constant folding (runtime/executable.py): folding would turn DequantizeLinear(W) into a
float32 weight.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dynshape.ir.graph import Graph, Node
from dynshape.ir.opdef import is_default_domain
from dynshape.ir.types import TensorType
from dynshape.passes.layout import Rewrite
from dynshape.passes.quant import as_int8

DOMAIN = "dynshape"
F32 = np.dtype(np.float32)
INT8_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def _scalar(c: np.ndarray | None, dtypes: tuple) -> bool:
    return c is not None and c.size == 1 and c.ndim <= 1 and np.dtype(c.dtype) in dtypes


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return a is not None and b is not None and a.dtype == b.dtype and np.array_equal(a.reshape(-1), b.reshape(-1))


def _op(n: Node | None, op: str) -> bool:
    return n is not None and n.op_type == op and is_default_domain(n)


def _input(n: Node, i: int) -> str | None:
    return n.inputs[i] if len(n.inputs) > i and n.inputs[i] else None


class _Graph:
    """The node list's producers, readers and constants, and what the rewrite adds."""

    def __init__(self, nodes: list[Node], types: dict, consts: dict):
        self.nodes, self.types, self.consts = nodes, types, consts
        self.producer = {o: n for n in nodes for o in n.outputs if o}
        self.rw = Rewrite([], {}, {})

    def const(self, name: str | None) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    def add(self, base: str, value: np.ndarray) -> str:
        name = self.rw.fresh(base, self.types)
        self.rw.consts[name] = value
        self.rw.types[name] = TensorType(value.dtype, value.shape)
        return name

    def zero_point(self, dq: Node, dtype: np.dtype) -> str | None:
        """A DequantizeLinear's zero point, or a zero of `dtype` when it has none."""
        return _input(dq, 2) or self.add(f"{dq.inputs[0]}_zp0", np.zeros((), dtype))


def _weight(g: _Graph, dq: Node | None, trans: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(W as int8 (k, n), its zero points int32 (n,), its scales float32 (n,)) of DequantizeLinear(W) by a constant
    8-bit matrix, per tensor or per output column; None otherwise."""
    if not _op(dq, "DequantizeLinear") or dq.attrs.get("block_size", 0):
        return None
    w, s, z = g.const(dq.inputs[0]), g.const(_input(dq, 1)), g.const(_input(dq, 2))
    if w is None or w.ndim != 2 or np.dtype(w.dtype) not in INT8_TYPES or s is None or s.dtype != F32 \
            or (z is not None and (z.dtype != w.dtype or z.shape != s.shape)):
        return None
    if trans:
        w = w.T
    n = w.shape[1]
    axis = dq.attrs.get("axis", 1) % 2
    if not (s.size == 1 and s.ndim <= 1 or s.shape == (n,) and axis == (0 if trans else 1)):
        return None
    w8, z32 = as_int8(np.ascontiguousarray(w), z)
    return np.ascontiguousarray(w8), z32, np.ascontiguousarray(np.broadcast_to(s.reshape(-1), (n,)), dtype=F32)


def _activation(g: _Graph, name: str) -> tuple[str, str, str, np.ndarray] | None:
    """(x, x_scale, x_zero_point, the scale's value) of DequantizeLinear(QuantizeLinear(x)) per tensor with the same
    parameters (x float32), or of DequantizeLinear(q) with q an 8-bit tensor; None otherwise."""
    dq = g.producer.get(name)
    if not _op(dq, "DequantizeLinear") or dq.attrs.get("block_size", 0):
        return None
    qa, s_name, z_name = dq.inputs[0], _input(dq, 1), _input(dq, 2)
    s, z = g.const(s_name), g.const(z_name)
    qt = g.types.get(qa)
    if not isinstance(qt, TensorType) or np.dtype(qt.dtype) not in INT8_TYPES or not _scalar(s, (F32,)) \
            or (z_name and not _scalar(z, (np.dtype(qt.dtype),))):
        return None
    q = g.producer.get(qa)
    if _op(q, "QuantizeLinear") and not q.attrs.get("block_size", 0) and not q.attrs.get("precision", 0) \
            and _same(g.const(_input(q, 1)), s) and (_same(g.const(_input(q, 2)), z) if z_name else not _input(q, 2)):
        xt = g.types.get(q.inputs[0])
        if isinstance(xt, TensorType) and xt.dtype == F32 and xt.shape:
            return q.inputs[0], s_name, g.zero_point(dq, np.dtype(qt.dtype)), s
    if qt.shape:
        return qa, s_name, g.zero_point(dq, np.dtype(qt.dtype)), s
    return None


def _product(g: _Graph, n: Node) -> list[Node] | None:
    """A MatMul or Gemm of a quantized activation by DequantizeLinear(W) as QuantizedMatMul (and its bias)."""
    gemm = _op(n, "Gemm")
    if not (_op(n, "MatMul") or gemm) or len(n.inputs) < 2:
        return None
    yt = g.types.get(n.outputs[0])
    if not isinstance(yt, TensorType) or yt.dtype != F32:
        return None
    bias = _input(n, 2) if gemm else None
    if gemm and (n.attrs.get("alpha", 1.0) != 1.0 or n.attrs.get("transA", 0)
                 or (bias and n.attrs.get("beta", 1.0) != 1.0)):
        return None
    w = _weight(g, g.producer.get(n.inputs[1]), bool(gemm and n.attrs.get("transB", 0)))
    act = _activation(g, n.inputs[0])
    if w is None or act is None:
        return None
    x, xs, xz, s = act
    xt = g.types[x]
    if gemm and len(xt.shape) != 2:
        return None
    w8, z32, sw = w
    base = g.producer[n.inputs[1]].inputs[0]
    mult = (np.float32(s.reshape(-1)[0]) * sw).astype(F32)  # the dequantized product's scale, rounded once
    ins = [x, xs, xz, g.add(f"{base}_q8", w8), g.add(f"{base}_zp32", z32), g.add(f"{base}_mult", mult)]
    if not bias:
        return [Node("QuantizedMatMul", DOMAIN, n.name, {}, ins, [n.outputs[0]])]
    y0 = g.rw.fresh(f"{n.outputs[0]}_nobias", g.types)
    g.rw.types[y0] = yt
    return [Node("QuantizedMatMul", DOMAIN, n.name, {}, ins, [y0]),
            Node("Add", "", f"{n.name}_bias", {}, [y0, bias], [n.outputs[0]])]


def _pair(g: _Graph, dq: Node) -> Node | None:
    """DequantizeLinear(QuantizeLinear(x)) per tensor, 8-bit, same parameters, as one QuantizeDequantize."""
    if not _op(dq, "DequantizeLinear"):
        return None
    q = g.producer.get(dq.inputs[0])
    if not _op(q, "QuantizeLinear") or q.attrs.get("block_size", 0) or q.attrs.get("precision", 0) \
            or dq.attrs.get("block_size", 0):
        return None
    s, z = g.const(_input(dq, 1)), g.const(_input(dq, 2))
    qt, xt = g.types.get(q.outputs[0]), g.types.get(q.inputs[0])
    if not isinstance(qt, TensorType) or np.dtype(qt.dtype) not in INT8_TYPES or not isinstance(xt, TensorType) \
            or xt.dtype != F32 or not _scalar(s, (F32,)) or not _same(g.const(_input(q, 1)), s):
        return None
    if _input(dq, 2) or _input(q, 2):
        if not _scalar(z, INT8_TYPES) or not _same(g.const(_input(q, 2)), z):
            return None
    return Node("QuantizeDequantize", DOMAIN, dq.name, {},
                [q.inputs[0], dq.inputs[1], g.zero_point(dq, np.dtype(qt.dtype))], list(dq.outputs))


def _drop_dead(nodes: list[Node], keep: set[str]) -> list[Node]:
    """Quantizers whose outputs nothing reads any more go (repeatedly: a DequantizeLinear, then its QuantizeLinear)."""
    ops = {("", "QuantizeLinear"), ("", "DequantizeLinear"), (DOMAIN, "QuantizeDequantize")}
    while True:
        read = {x for n in nodes for x in (*n.inputs, *n.free_names()) if x} | keep
        dead = {id(n) for n in nodes if ("" if is_default_domain(n) else n.domain, n.op_type) in ops
                and not any(o in read for o in n.outputs if o)}
        if not dead:
            return nodes
        nodes = [n for n in nodes if id(n) not in dead]


def fuse_qdq(graph: Graph) -> Graph:
    """The graph with its QDQ products as QuantizedMatMul and its other QDQ pairs as QuantizeDequantize."""
    consts = graph.constants()
    g = _Graph(list(graph.nodes), graph.types, consts)
    out: list[Node] = []
    for n in g.nodes:
        out += _product(g, n) or [n]
    keep = {v.name for v in graph.outputs}
    out = _drop_dead(out, keep)
    g.producer = {o: n for n in out for o in n.outputs if o}
    out = _drop_dead([_pair(g, n) or n for n in out], keep)
    if not g.rw.types and len(out) == len(graph.nodes):
        return graph
    return dataclasses.replace(graph, nodes=out, initializers={**graph.initializers, **g.rw.consts},
                               types={**graph.types, **g.rw.types}, variants={})


def fuse_qlinear(nodes: list[Node], types: dict, consts: dict, keep: set[str]) -> Rewrite:
    """QLinearMatMul by a constant 8-bit matrix, per-tensor a and y parameters, as QuantizedMatMul (exact)."""
    g = _Graph(list(nodes), types, consts)
    out: list[Node] = []
    for n in nodes:
        new = None
        if _op(n, "QLinearMatMul") and len(n.inputs) == 8 and all(n.inputs):
            a, a_s, a_z, b, b_s, b_z, y_s, y_z = (g.const(x) for x in n.inputs)
            at = types.get(n.inputs[0])
            ok = (isinstance(at, TensorType) and at.shape and np.dtype(at.dtype) in INT8_TYPES
                  and _scalar(a_s, (F32,)) and _scalar(a_z, (np.dtype(at.dtype),)) and _scalar(y_s, (F32,))
                  and _scalar(y_z, INT8_TYPES) and b is not None and b.ndim == 2 and np.dtype(b.dtype) in INT8_TYPES
                  and b_s is not None and b_s.dtype == F32 and b_z is not None and b_z.dtype == b.dtype
                  and b_s.size in (1, b.shape[1]) and b_s.ndim <= 1 and b_z.size in (1, b.shape[1])
                  and b_z.ndim <= 1)
            if ok:
                k, cols = b.shape
                w8, z32 = as_int8(b, b_z.reshape(-1) if b_z.size > 1 else b_z.reshape(()))
                mult = np.asarray(a_s * b_s / y_s, F32).reshape(-1)  # as the spec's reference: float32 scales
                mult = np.ascontiguousarray(np.broadcast_to(mult, (cols,)), dtype=F32)
                base = n.inputs[3]
                new = Node("QuantizedMatMul", DOMAIN, n.name, {},
                           [n.inputs[0], n.inputs[1], n.inputs[2], g.add(f"{base}_q8", np.ascontiguousarray(w8)),
                            g.add(f"{base}_zp32", z32), g.add(f"{base}_mult", mult), n.inputs[7]], list(n.outputs))
        out.append(new or n)
    g.rw.nodes = out
    return g.rw
