"""Dynamically quantized convolutions (DynamicQuantizeLinear -> ConvInteger) as exact float32 convolutions.

onnxruntime's `quantize_dynamic` leaves each Conv of a float model as a DynamicQuantizeLinear of its activation, a
ConvInteger by uint8 or int8 weights, an int32 bias rounded under the per-call scale, and a Cast back to float
(ops/dynquant_conv.py spells out the chain). dynshape had no kernel for ConvInteger or DynamicQuantizeLinear: the
ddddocr recogniser ran its 21 convolutions on numpy, 4-5x slower than onnxruntime.

Each such ConvInteger becomes a float32 Conv of `QuantizeCentered(x)` (the quantized activation minus its zero
point, as floats) by the constant `float32(w - w_zero_point)`, which the compiler runs as any other convolution
(packed weights, channels last, the epilogue fused). It is exact: see ops/dynquant_conv.py for the bound the
weights must meet, which is checked here per ConvInteger (one that fails it keeps its reference). The int32 bias
addition and the Cast back to float become one `IntegerAdd`, an elementwise op that joins the epilogue.

A DynamicQuantizeLinear is rewritten only when every reader of its quantized output is a ConvInteger rewritten
here; its scale and zero point keep their names (the scale's other readers are untouched).
"""

from __future__ import annotations

import numpy as np

from dynshape.ir.graph import Node
from dynshape.ir.opdef import is_default_domain
from dynshape.ir.types import TensorType
from dynshape.passes.layout import Rewrite
from dynshape.passes.values import dataflow

DOMAIN = "dynshape"
FLOAT, INT32 = 1, 6  # TensorProto.FLOAT, TensorProto.INT32
EXACT = 2**24  # float32 holds every integer of smaller magnitude
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def centered_weights(w: np.ndarray, zp: np.ndarray | None) -> np.ndarray | None:
    """w - zero_point (per tensor or per output channel) as int64, or None for a zero point of another shape."""
    wc = np.asarray(w).astype(np.int64)
    if zp is None:
        return wc
    z = np.asarray(zp).astype(np.int64).reshape(-1)
    if z.size == 1:
        return wc - z[0]
    if z.size != wc.shape[0]:
        return None
    return wc - z.reshape((-1,) + (1,) * (wc.ndim - 1))


def exact_in_float32(wc: np.ndarray) -> bool:
    """Whether every partial sum of one output of the convolution stays below 2^24 in magnitude for any activation
    in -255..255 (a quantized uint8 value minus its zero point), in any order of summation."""
    if wc.size == 0:
        return True
    per_channel = np.abs(wc).reshape(wc.shape[0], -1).sum(axis=1)
    return int(per_channel.max()) * 255 < EXACT


def _conv_integer(ci: Node, producer: dict, types: dict, consts: dict) -> tuple[Node, np.ndarray] | None:
    """(the DynamicQuantizeLinear feeding ci, ci's centered weights) when ci can run as an exact float Conv."""
    if ci.op_type != "ConvInteger" or not is_default_domain(ci) or len(ci.inputs) < 3 or not ci.inputs[2]:
        return None
    d = producer.get(ci.inputs[0])
    if d is None or d.op_type != "DynamicQuantizeLinear" or not is_default_domain(d) \
            or ci.inputs[0] != d.outputs[0] or ci.inputs[2] != d.outputs[2]:
        return None
    xt = types.get(d.inputs[0])
    w = consts.get(ci.inputs[1])
    wzp = consts.get(ci.inputs[3]) if len(ci.inputs) > 3 and ci.inputs[3] else None
    if not isinstance(xt, TensorType) or xt.dtype != np.float32 or w is None or w.dtype not in (np.uint8, np.int8) \
            or w.ndim < 3 or (len(ci.inputs) > 3 and ci.inputs[3] and wzp is None):
        return None
    wc = centered_weights(w, wzp)
    return None if wc is None or not exact_in_float32(wc) else (d, wc)


def float_conv_integer(nodes: list[Node], types: dict, consts: dict, keep: set[str]) -> Rewrite:
    """The rewrite described above; every node it does not take is kept as it is, in order."""
    producer, readers = dataflow(nodes)
    found: dict[int, tuple[Node, list[tuple[Node, np.ndarray]]]] = {}
    for n in nodes:
        hit = _conv_integer(n, producer, types, consts)
        if hit is not None:
            found.setdefault(id(hit[0]), (hit[0], []))[1].append((n, hit[1]))
    rw = Rewrite([], {}, {})
    before: dict[int, list[Node]] = {}  # id(node) -> the new nodes that take its place
    for d, convs in found.values():
        taken = {id(ci) for ci, _ in convs}
        if d.outputs[0] in keep or any(id(r) not in taken for r in readers.get(d.outputs[0], [])):
            continue
        x = d.inputs[0]
        scale = d.outputs[1] or rw.fresh(f"{x}_scale", types)
        c = rw.fresh(f"{x}_centered", types)
        rw.types[c] = TensorType(np.dtype(np.float32), types[x].shape)
        if not d.outputs[1]:
            rw.types[scale] = TensorType(np.dtype(np.float32), ())
        before[id(d)] = [Node("DynamicQuantParams", DOMAIN, d.name, {}, [x], [scale, d.outputs[2]]),
                         Node("QuantizeCentered", DOMAIN, f"{d.name}_centered", {}, [x, scale, d.outputs[2]], [c])]
        for ci, wc in convs:
            before[id(ci)], tail = _float_conv(ci, c, wc, readers, keep, types, rw)
            before.update(tail)
    rw.nodes = [m for n in nodes for m in before.get(id(n), [n])]
    return rw


def _float_conv(ci: Node, c: str, wc: np.ndarray, readers: dict, keep: set[str], types: dict,
                rw: Rewrite) -> tuple[list[Node], dict[int, list[Node]]]:
    """The float Conv replacing ci, and what replaces the bias Add and Cast after it (by node id) when they are
    there: `IntegerAdd` at the Add's place (its bias is computed after the ConvInteger), nothing at the Cast's."""
    y = ci.outputs[0]
    w = rw.fresh(f"{ci.inputs[1]}_float", types)
    rw.consts[w] = wc.astype(np.float32)
    rw.types[w] = TensorType(np.dtype(np.float32), wc.shape)
    f = rw.fresh(f"{y}_float", types)
    rw.types[f] = TensorType(np.dtype(np.float32), types[y].shape)
    conv = Node("Conv", "", f"{ci.name}_float", {k: v for k, v in ci.attrs.items() if k in _CONV_ATTRS}, [c, w], [f])

    def only_reader(name: str) -> Node | None:
        users = readers.get(name, [])
        return users[0] if len(users) == 1 and name not in keep else None

    def cast_to_float(n: Node | None) -> bool:
        return n is not None and n.op_type == "Cast" and is_default_domain(n) and n.attrs.get("to") == FLOAT

    nxt = only_reader(y)
    if cast_to_float(nxt):  # float32(int32(f)) == f: f holds integers below 2^24
        return [conv], {id(nxt): [Node("Identity", "", nxt.name, {}, [f], [nxt.outputs[0]])]}
    if nxt is not None and nxt.op_type == "Add" and is_default_domain(nxt) and len(nxt.inputs) == 2:
        bias = nxt.inputs[1] if nxt.inputs[0] == y else nxt.inputs[0]
        cast = only_reader(nxt.outputs[0])
        bt = types.get(bias)
        if bias != y and cast_to_float(cast) and isinstance(bt, TensorType) and bt.dtype == np.int32:
            add = Node("IntegerAdd", DOMAIN, nxt.name, {}, [f, bias], [cast.outputs[0]])
            return [conv], {id(nxt): [add], id(cast): []}
    return [conv, Node("Cast", "", f"{ci.name}_int32", {"to": INT32}, [f], [y])], {}
