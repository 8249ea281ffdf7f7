"""Dynamic quantization as onnxruntime writes it, rewritten into one node per product.

onnxruntime's `quantize_dynamic` turns each MatMul by a constant weight into

    q, s, z = DynamicQuantizeLinear(x)             (often shared by the Q, K and V products of one input)
    acc = MatMulInteger(q, W_int8, z, W_zp)
    y = Mul(Cast(acc, to=float), Mul(s, W_scale))

which, run op by op, writes the uint8 activation, an int32 matrix and two float matrices per product. Each chain
becomes `dynshape::DynamicQuantizeMatMul(x, W', W_zp', W_scale')` (ops/dynquant.py: exactly the chain's values),
with W' int8 (uint8 weights shifted by -128 with their zero points) and per-column zero points and scales, so the
fusion rules see one product by a constant (passes/qproduct.py) that takes its bias and activation as an epilogue,
and the compiler runs it as one int8 kernel (codegen/lower/qproduct.py). A DynamicQuantizeLinear, or a Mul of the
scales, whose outputs nothing reads any more goes with it; one still read elsewhere stays.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dynshape.ir.graph import Graph, Node
from dynshape.ir.opdef import is_default_domain
from dynshape.ir.types import TensorType
from dynshape.options import Options
from dynshape.passes.constfold import fold_constant_nodes
from dynshape.passes.layout import Rewrite
from dynshape.passes.values import dataflow

DOMAIN = "dynshape"
FLOAT = 1  # TensorProto.FLOAT


def _vector(c: np.ndarray | None, n: int) -> bool:
    """c is one value or one per column of an n-column product."""
    return c is not None and (c.size == 1 and c.ndim <= 1 or c.shape == (n,))


def as_int8(w: np.ndarray, zp: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(W as int8, its zero points as int32 per column) with W - zp unchanged: uint8 weights shifted by -128."""
    w = np.asarray(w)
    n = w.shape[-1]
    z = np.zeros(n, np.int32) if zp is None else np.broadcast_to(np.asarray(zp).astype(np.int32).reshape(-1), (n,))
    if w.dtype == np.uint8:
        return (w.astype(np.int16) - 128).astype(np.int8), (z - 128).astype(np.int32)
    if w.dtype != np.int8:
        raise TypeError(f"int8 products take int8 or uint8 weights, got {w.dtype}")
    return w, z.astype(np.int32)


def fuse_dynamic_quant(nodes: list[Node], types: dict, consts: dict, keep: set[str]) -> Rewrite:
    """The rewrite described above; nodes that match no chain are kept as they are, in order."""
    producer, readers = dataflow(nodes)

    def only_reader(name: str) -> Node | None:
        users = readers.get(name, [])
        return users[0] if len(users) == 1 and name not in keep else None

    rw = Rewrite([], {}, {})
    replaced: dict[int, Node] = {}  # id(final Mul) -> the new node
    dropped: set[int] = set()
    for mm in nodes:
        if mm.op_type != "MatMulInteger" or not is_default_domain(mm) or len(mm.inputs) < 3 or not mm.inputs[2]:
            continue
        d = producer.get(mm.inputs[0])
        if d is None or d.op_type != "DynamicQuantizeLinear" or not is_default_domain(d) \
                or list(mm.inputs[:1]) + [mm.inputs[2]] != [d.outputs[0], d.outputs[2]]:
            continue
        w = consts.get(mm.inputs[1])
        wzp = consts.get(mm.inputs[3]) if len(mm.inputs) > 3 and mm.inputs[3] else None
        xt = types.get(d.inputs[0])
        if w is None or w.ndim != 2 or w.dtype not in (np.int8, np.uint8) or not isinstance(xt, TensorType) \
                or xt.dtype != np.float32 or not xt.shape:
            continue
        n = w.shape[1]
        if wzp is not None and (wzp.dtype != w.dtype or not _vector(wzp, n)):
            continue
        cast = only_reader(mm.outputs[0])
        if cast is None or cast.op_type != "Cast" or not is_default_domain(cast) or cast.attrs.get("to") != FLOAT:
            continue
        mul = only_reader(cast.outputs[0])
        if mul is None or mul.op_type != "Mul" or not is_default_domain(mul) or len(mul.inputs) != 2:
            continue
        other = mul.inputs[1] if mul.inputs[0] == cast.outputs[0] else mul.inputs[0]
        ms = producer.get(other)
        if ms is None or ms.op_type != "Mul" or not is_default_domain(ms) or len(ms.inputs) != 2 \
                or d.outputs[1] not in ms.inputs:
            continue
        ws_name = ms.inputs[1] if ms.inputs[0] == d.outputs[1] else ms.inputs[0]
        ws = consts.get(ws_name)
        if ws is None or ws.dtype != np.float32 or not _vector(ws, n) or ws_name == d.outputs[1]:
            continue
        # the kernel's int8 operands, computed once here (the weights as int8, per-column parameters)
        w8, z32 = as_int8(w, wzp)
        base = mm.inputs[1]
        names = [rw.fresh(f"{base}_q8", types), rw.fresh(f"{base}_zp32", types), rw.fresh(f"{base}_scale32", types)]
        vals = [np.ascontiguousarray(w8), z32, np.ascontiguousarray(np.broadcast_to(ws.reshape(-1), (n,)),
                                                                       dtype=np.float32)]
        for name, v in zip(names, vals):
            rw.consts[name] = v
            rw.types[name] = TensorType(v.dtype, v.shape)
        replaced[id(mul)] = Node("DynamicQuantizeMatMul", DOMAIN, mm.name or mul.name, {},
                                 [d.inputs[0], *names], [mul.outputs[0]])
        dropped |= {id(mm), id(cast)}
    if not replaced:
        return Rewrite(list(nodes), {}, {})
    kept = [replaced.get(id(n), n) for n in nodes if id(n) not in dropped]
    # what the rewritten chains leave unread: the scales' Mul, then the DynamicQuantizeLinear (in that order)
    while True:
        read = {x for n in kept for x in (*n.inputs, *n.free_names()) if x}
        dead = [n for n in kept if n.op_type in ("Mul", "DynamicQuantizeLinear") and is_default_domain(n)
                and not any(o in read or o in keep for o in n.outputs if o)]
        if not dead:
            break
        gone = {id(n) for n in dead}
        kept = [n for n in kept if id(n) not in gone]
    rw.nodes = kept
    return rw


# ---- ds.quantize_dynamic: a float model's products by constant weights, quantized ---------------------------------
def quantize_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W (k, n) float32 as symmetric int8 per column: (round(W / s_j) saturated to -127..127, s_j = max|W[:, j]| / 127;
    1 for a column of zeros)."""
    w = np.asarray(w, np.float32)
    s = (np.max(np.abs(w), axis=0, initial=np.float32(0)) / np.float32(127)).astype(np.float32)
    s = np.where(s > 0, s, np.float32(1)).astype(np.float32)
    return np.clip(np.rint(w / s), -127, 127).astype(np.int8), s


def quantize_dynamic(graph: Graph, min_weights: int = 0) -> Graph:
    """`ds.quantize_dynamic`: every MatMul of a float32 activation by a constant float32 matrix (and every Gemm with
    alpha 1, no transA, beta 1: its bias an Add after), with at least `min_weights` weights, as a
    `dynshape::DynamicQuantizeMatMul` with `per_token=1`: int8 weights quantized per output column here, once
    (symmetric: round(W / s_j), s_j = max|W[:, j]| / 127), the activation quantized per row at each call
    (symmetric, s_i = max|x_i| / 127), int32 sums on the int8 kernel, float32 scales and epilogue. Opt-in and
    approximate: the result is a different model, whose error against the float one the caller should measure (bench
    /int8_bench.py reports it for bert_small). Constant subgraphs are folded first, so weights made by nodes
    (a Transpose of an initializer) count as constants. Every other node is kept as it is."""
    folded = fold_constant_nodes(graph, Options().fold_bytes).graph
    consts = folded.constants()
    types = folded.types
    rw = Rewrite([], {}, {})
    out: list[Node] = []

    def add(base: str, v: np.ndarray) -> str:
        name = rw.fresh(base, types)
        rw.consts[name], rw.types[name] = v, TensorType(v.dtype, v.shape)
        return name

    for n in folded.nodes:
        gemm = n.op_type == "Gemm" and is_default_domain(n)
        w = consts.get(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else None
        xt, yt = types.get(n.inputs[0]) if n.inputs else None, types.get(n.outputs[0])
        bias = n.inputs[2] if gemm and len(n.inputs) > 2 and n.inputs[2] else None
        ok = ((n.op_type == "MatMul" and is_default_domain(n)) or gemm) and w is not None and w.ndim == 2 \
            and w.dtype == np.float32 and w.size >= max(min_weights, 1) and isinstance(xt, TensorType) \
            and xt.dtype == np.float32 and xt.shape and isinstance(yt, TensorType) and yt.dtype == np.float32
        if ok and gemm:
            ok = n.attrs.get("alpha", 1.0) == 1.0 and not n.attrs.get("transA", 0) and len(xt.shape) == 2 \
                and (bias is None or n.attrs.get("beta", 1.0) == 1.0)
            w = w.T if n.attrs.get("transB", 0) else w
        if not ok:
            out.append(n)
            continue
        w8, s = quantize_weights(w)
        base = n.inputs[1]
        ins = [n.inputs[0], add(f"{base}_q8", np.ascontiguousarray(w8)), add(f"{base}_zp32", np.zeros(w8.shape[1],
                                                                                                  np.int32)),
               add(f"{base}_scale32", s)]
        if bias is None:
            out.append(Node("DynamicQuantizeMatMul", DOMAIN, n.name, {"per_token": 1}, ins, [n.outputs[0]]))
            continue
        y0 = rw.fresh(f"{n.outputs[0]}_nobias", types)
        rw.types[y0] = yt
        out += [Node("DynamicQuantizeMatMul", DOMAIN, n.name, {"per_token": 1}, ins, [y0]),
                Node("Add", "", f"{n.name}_bias", {}, [y0, bias], [n.outputs[0]])]
    if not rw.consts:
        return folded
    read = {x for n in out for x in (*n.inputs, *n.free_names()) if x} | {v.name for v in folded.inputs} \
        | {v.name for v in folded.outputs}
    inits = {k: v for k, v in {**folded.initializers, **rw.consts}.items() if k in read}
    return dataclasses.replace(folded, nodes=out, initializers=inits, types={**types, **rw.types}, variants={})
