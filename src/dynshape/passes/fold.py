"""Constant folding of inference-time normalisation: BatchNormalization into the weights before it.

BatchNormalization in inference mode is y = x * k + (bias - mean * k) per channel, k = scale / sqrt(var + eps).
After a Conv (or ConvTranspose) whose weights and bias are constants and that nothing else reads, it folds into
them at compile time (W'[co] = W[co] * k[co], B' = B * k + bias - mean * k): the convolution's kernel then
computes the normalised result, with no pass of its own. Anywhere else it becomes Mul and Add by per-channel
constants, which join an elementwise group or a kernel's epilogue.

Not exact to the last bit: the folded constants are rounded once in float32 instead of the four roundings of
the reference; the result stays within a few float32 ulp of it (tests compare against the reference).
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dynshape.ir.buffers import fresh_array
from dynshape.ir.graph import Node
from dynshape.ir.types import TensorType
from dynshape.passes.layout import Rewrite


def _bn_params(n: Node, consts: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(k, shift) of an inference-mode BatchNormalization with constant parameters, else None."""
    if n.op_type != "BatchNormalization" or n.domain not in ("", "ai.onnx") or n.attrs.get("training_mode", 0):
        return None
    if len(n.inputs) < 5 or any(o for o in n.outputs[1:]):
        return None
    params = [consts.get(x) for x in n.inputs[1:5]]
    if any(p is None or p.ndim != 1 or p.dtype.kind != "f" for p in params):
        return None
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    k = scale / np.sqrt(var + float(n.attrs.get("epsilon", 1e-5)))
    return k, bias - mean * k


def fold_batchnorm(nodes: list[Node], types: dict, consts: dict, keep: set[str]) -> Rewrite:
    readers: dict[str, int] = {}
    for n in nodes:
        for x in n.inputs:
            readers[x] = readers.get(x, 0) + 1
    producer = {o: n for n in nodes for o in n.outputs if o}
    rw = Rewrite([], {}, {})
    replaced: dict[int, Node] = {}
    dropped: set[int] = set()
    scalings: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (w, k, out): run after the walk, see _scale_all
    for n in nodes:
        params = _bn_params(n, consts)
        if params is None:
            continue
        k, shift = params
        x = n.inputs[0]
        t = types.get(x)
        if not isinstance(t, TensorType) or np.dtype(t.dtype) != np.float32:
            continue
        conv = producer.get(x)
        if conv is not None and id(conv) not in replaced and _foldable(conv, consts, readers, keep, len(k)):
            # the weights scaled in float32 by k rounded to float32 (one pass, no float64 copy of every weight:
            # ResNet-50's 25 M took 0.2 s): within 1 ulp of the float64 product rounded
            w = consts[conv.inputs[1]]
            b = consts[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] else 0.0
            k32 = k.astype(np.float32)
            out = fresh_array(w.shape)  # (numpy's own large arrays may stall in THP compaction: ir/buffers.py)
            if conv.op_type == "Conv":
                job = (w, k32.reshape(-1, *[1] * (w.ndim - 1)), out)
            else:  # ConvTranspose: W is (C_in, C_out / group, ...), output channel co = g * C_out/g + j
                g = int(conv.attrs.get("group", 1))
                cg = w.shape[1]
                job = (w.reshape(g, -1, cg, *w.shape[2:]), k32.reshape(g, 1, cg, *[1] * (w.ndim - 2)),
                       out.reshape(g, -1, cg, *w.shape[2:]))
            scalings.append(job)
            w = out
            wn, bn = rw.fresh(conv.inputs[1], types), rw.fresh(n.name or "bn", types)
            for name, v in ((wn, w), (bn, (b * k + shift).astype(np.float32))):
                rw.consts[name] = v
                rw.types[name] = TensorType(v.dtype, v.shape, v)
            replaced[id(conv)] = dataclasses.replace(conv, inputs=[conv.inputs[0], wn, bn], outputs=[n.outputs[0]])
            dropped.add(id(n))
            continue
        rank = len(t.shape)
        shape = (len(k), *[1] * (rank - 2))
        kn, sn, mid = rw.fresh(f"{n.name}_k", types), rw.fresh(f"{n.name}_shift", types), rw.fresh(x, types)
        for name, v in ((kn, k.astype(np.float32).reshape(shape)), (sn, shift.astype(np.float32).reshape(shape))):
            rw.consts[name] = v
            rw.types[name] = TensorType(v.dtype, v.shape, v)
        rw.types[mid] = types[n.outputs[0]]
        replaced[id(n)] = [Node("Mul", "", f"{n.name}__scale", {}, [x, kn], [mid]),
                           Node("Add", "", f"{n.name}__shift", {}, [mid, sn], [n.outputs[0]])]
    _scale_all(scalings)
    for n in nodes:
        if id(n) in dropped:
            continue
        new = replaced.get(id(n), n)
        rw.nodes += new if isinstance(new, list) else [new]
    return rw


PARALLEL_FOLD_BYTES = 8 << 20  # folded weights from this total are scaled on two threads


def _scale_all(jobs: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """out = w * k for each (w, k, out), on two threads when they are large: numpy's multiply drops the GIL, and
    its cost here is the first touch of the fresh pages it writes (~2 us a page on this VM; ResNet-50 folds
    100 MB), which two cores take in parallel."""
    def scale(job: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        np.multiply(job[0], job[1], out=job[2], dtype=np.float32)

    if len(jobs) < 2 or sum(j[2].nbytes for j in jobs) < PARALLEL_FOLD_BYTES:
        for job in jobs:
            scale(job)
        return
    with ThreadPoolExecutor(2) as pool:  # the largest first, so the two workers end together
        list(pool.map(scale, sorted(jobs, key=lambda j: -j[2].nbytes)))


def _foldable(conv: Node, consts: dict, readers: dict, keep: set[str], channels: int) -> bool:
    if conv.op_type not in ("Conv", "ConvTranspose") or conv.domain not in ("", "ai.onnx"):
        return False
    y = conv.outputs[0]
    if readers.get(y, 0) != 1 or y in keep or conv.inputs[1] not in consts:
        return False
    if len(conv.inputs) > 2 and conv.inputs[2] and conv.inputs[2] not in consts:
        return False
    w = consts[conv.inputs[1]]
    out = w.shape[0] if conv.op_type == "Conv" else w.shape[1] * int(conv.attrs.get("group", 1))
    return w.dtype == np.float32 and out == channels


def drop_inference_dropout(nodes: list[Node], types: dict, consts: dict, keep: set[str]) -> Rewrite:
    """Dropout in inference mode is the identity: its readers read its input instead, and it runs no step.

    Inference mode is what the reference computes: training_mode (opset 12's third input) absent or a constant
    false. Kept where its mask is read, where its output is a graph output (the output needs its own value)
    or where a subgraph names it (a Loop or If body reads it by name).
    """
    readers: dict[str, int] = {}
    named = {x for n in nodes for x in n.free_names()}
    for n in nodes:
        for x in n.inputs:
            readers[x] = readers.get(x, 0) + 1
    alias: dict[str, str] = {}
    rw = Rewrite([], {}, {})
    for n in nodes:
        ins = [alias.get(x, x) for x in n.inputs]
        if n.op_type == "Dropout" and n.domain in ("", "ai.onnx") and _inference(n, consts):
            y, masks = n.outputs[0], [m for m in n.outputs[1:] if m]
            if y not in keep and y not in named and not any(readers.get(m) or m in keep for m in masks):
                alias[y] = ins[0]
                continue
        rw.nodes.append(dataclasses.replace(n, inputs=ins) if ins != list(n.inputs) else n)
    return rw


def _inference(n: Node, consts: dict) -> bool:
    if len(n.inputs) < 3 or not n.inputs[2]:
        return True
    mode = consts.get(n.inputs[2])
    return mode is not None and not bool(np.ravel(mode)[0])
