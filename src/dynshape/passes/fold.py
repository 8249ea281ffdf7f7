"""Constant folding of inference-time normalisation: BatchNormalization (and per-channel scales and shifts) into
the weights before it.

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
from dynshape.ir.opdef import is_default_domain
from dynshape.ir.types import TensorType
from dynshape.passes.layout import Rewrite

# the most channels a Mul / Add / Sub by one constant value is taken as a per-channel affine for: that takes
# float64 vectors of the channels (and float32 constants where a chain becomes one Mul and one Add); no real model
# comes near it, and a declared dim of 10^9 (fuzzer case 5483, seed 1207) took 16 GB before any error
MAX_CHANNELS = 1 << 20


def _bn_params(n: Node, consts: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(k, shift) of an inference-mode BatchNormalization with constant parameters, else None."""
    if n.op_type != "BatchNormalization" or not is_default_domain(n) or n.attrs.get("training_mode", 0):
        return None
    if len(n.inputs) < 5 or any(o for o in n.outputs[1:]):
        return None
    params = [consts.get(x) for x in n.inputs[1:5]]
    if any(p is None or p.ndim != 1 or p.dtype.kind != "f" for p in params):
        return None
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    k = scale / np.sqrt(var + float(n.attrs.get("epsilon", 1e-5)))
    return k, bias - mean * k


def _channel_affine(n: Node, consts: dict, types: dict) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(x, k, shift) where n computes x * k + shift per channel of x (axis 1), k and shift constants in float64:
    an inference-mode BatchNormalization, or a Mul / Add / Sub (x - c) by a constant that is one value or one per
    channel (shape (C, 1, 1), (1, C, 1, 1), ...): the Caffe "Scale" layer that converted models put after each
    BatchNormalization (Inception v2, DenseNet). None for anything else."""
    bn = _bn_params(n, consts)
    if bn is not None:
        return n.inputs[0], bn[0], bn[1]
    if n.op_type not in ("Mul", "Add", "Sub") or not is_default_domain(n) or len(n.inputs) != 2:
        return None
    order = ((0, 1), (1, 0)) if n.op_type != "Sub" else ((0, 1),)
    for xi, ci in order:
        x, c = n.inputs[xi], consts.get(n.inputs[ci])
        t = types.get(x)
        if c is None or x in consts or not isinstance(t, TensorType) or len(t.shape) < 2 \
                or not isinstance(t.shape[1], int) or c.dtype != np.float32 or c.ndim > len(t.shape):
            continue
        channels = t.shape[1]
        if channels > MAX_CHANNELS:  # (no float64 vectors of 10^9 channels, a fuzzed input's dim: 16 GB)
            continue
        lead = (1,) * (len(t.shape) - c.ndim) + c.shape  # c's shape right-aligned to x's rank
        if any(d != 1 for i, d in enumerate(lead) if i != 1) or lead[1] not in (1, channels):
            continue
        v = np.broadcast_to(c.reshape(-1).astype(np.float64), (channels,))
        one, zero = np.ones(channels), np.zeros(channels)
        return (x, v, zero) if n.op_type == "Mul" else (x, one, v if n.op_type == "Add" else -v)
    return None


@dataclasses.dataclass
class _Fold:
    """What has folded into one conv so far: its output becomes `out` = conv * k + shift per output channel."""

    conv: Node
    k: np.ndarray
    shift: np.ndarray
    out: str


@dataclasses.dataclass
class _Chain:
    """A run of per-channel scalings and shifts with no conv to fold into, from `first` (reading x): `out` = x * k
    + shift per channel (axis 1 of a tensor of `rank` dims), `length` nodes."""

    first: Node
    x: str
    k: np.ndarray
    shift: np.ndarray
    out: str
    length: int
    rank: int


def _mul_add(c: _Chain, types: dict, rw: Rewrite) -> list[Node]:
    """The chain as one Mul by its k and one Add of its shift (constants (C, 1, ...), rounded once)."""
    shape = (len(c.k), *[1] * (c.rank - 2))
    name = c.first.name or "affine"
    kn, sn, mid = rw.fresh(f"{name}_k", types), rw.fresh(f"{name}_shift", types), rw.fresh(c.x, types)
    for v_name, v in ((kn, c.k.astype(np.float32).reshape(shape)), (sn, c.shift.astype(np.float32).reshape(shape))):
        rw.consts[v_name] = v
        rw.types[v_name] = TensorType(v.dtype, v.shape, v)
    rw.types[mid] = types[c.out]
    return [Node("Mul", "", f"{name}__scale", {}, [c.x, kn], [mid]), Node("Add", "", f"{name}__shift", {}, [mid, sn],
                                                                          [c.out])]


def fold_batchnorm(nodes: list[Node], types: dict, consts: dict, keep: set[str]) -> Rewrite:
    """Each inference BatchNormalization, and each per-channel Mul / Add / Sub by constants, after a conv whose
    output nothing else reads folds into the conv's weights and bias, a chain of them (BatchNormalization, then
    the converted Caffe Scale's Mul and Add) into the same conv. With no conv to fold into, a chain of them
    (each value between read by the next alone) becomes one Mul and one Add (DenseNet's BatchNormalization and
    Scale before each layer's Relu: four elementwise ops, two after; a conv can then take the two as its
    prologue, rules.match_conv_prologue), as does a BatchNormalization alone."""
    readers: dict[str, int] = {}
    for n in nodes:
        for x in n.inputs:
            readers[x] = readers.get(x, 0) + 1
    producer = {o: n for n in nodes for o in n.outputs if o}
    rw = Rewrite([], {}, {})
    replaced: dict[int, Node | list[Node]] = {}
    dropped: set[int] = set()
    folds: dict[int, _Fold] = {}  # id(conv) -> what folded into it
    folded_out: dict[str, int] = {}  # the value a folded conv now produces -> id(conv)
    chains: list[_Chain] = []  # runs of them with no conv before: each one Mul and one Add
    chain_out: dict[str, _Chain] = {}
    for n in nodes:
        aff = _channel_affine(n, consts, types)
        if aff is None:
            continue
        x, k, shift = aff
        t = types.get(x)
        if not isinstance(t, TensorType) or np.dtype(t.dtype) != np.float32:
            continue
        fid = folded_out.get(x)
        if fid is not None and (readers.get(x, 0) != 1 or x in keep or len(k) != len(folds[fid].k)):
            fid = None
        conv = producer.get(x)
        if fid is None and conv is not None and id(conv) not in folds \
                and _foldable(conv, consts, readers, keep, len(k)):
            fid = id(conv)
            folds[fid] = _Fold(conv, np.ones(len(k)), np.zeros(len(k)), x)
        if fid is not None:
            f = folds[fid]
            f.k, f.shift, f.out = f.k * k, f.shift * k + shift, n.outputs[0]
            folded_out[n.outputs[0]] = fid
            dropped.add(id(n))
            continue
        c = chain_out.get(x)
        if c is not None and readers.get(x, 0) == 1 and x not in keep and len(k) == len(c.k):
            c.k, c.shift, c.out, c.length = c.k * k, c.shift * k + shift, n.outputs[0], c.length + 1
            chain_out[n.outputs[0]] = c
            dropped.add(id(n))
            continue
        c = _Chain(n, x, k, shift, n.outputs[0], 1, len(t.shape))
        chains.append(c)
        chain_out[n.outputs[0]] = c
    for c in chains:  # a lone Mul / Add with nothing to fold into stays as it is
        if c.length > 1 or c.first.op_type == "BatchNormalization":
            replaced[id(c.first)] = _mul_add(c, types, rw)
    scalings: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (w, k, out): run after the walk, _scale_all
    for fid, f in folds.items():
        conv = f.conv
        # the weights scaled in float32 by k rounded to float32 (one pass, no float64 copy of every weight:
        # ResNet-50's 25 M took 0.2 s): within 1 ulp of the float64 product rounded
        w = consts[conv.inputs[1]]
        b = consts[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] else 0.0
        if np.any(f.k != 1.0):
            k32 = f.k.astype(np.float32)
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
        wn, bn = rw.fresh(conv.inputs[1], types), rw.fresh(f"{conv.name or 'conv'}_bias", types)
        for name, v in ((wn, w), (bn, (b * f.k + f.shift).astype(np.float32))):
            rw.consts[name] = v
            rw.types[name] = TensorType(v.dtype, v.shape, v)
        replaced[fid] = dataclasses.replace(conv, inputs=[conv.inputs[0], wn, bn], outputs=[f.out])
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
    if conv.op_type not in ("Conv", "ConvTranspose") or not is_default_domain(conv):
        return False
    y = conv.outputs[0]
    if readers.get(y, 0) != 1 or y in keep or conv.inputs[1] not in consts:
        return False
    if len(conv.inputs) > 2 and conv.inputs[2] and conv.inputs[2] not in consts:
        return False
    w = consts[conv.inputs[1]]
    out = w.shape[0] if conv.op_type == "Conv" else w.shape[1] * int(conv.attrs.get("group", 1))
    return w.dtype == np.float32 and out == channels


def drop_identities(nodes: list[Node], types: dict, consts: dict, keep: set[str]) -> Rewrite:
    """Nodes that compute their input unchanged run no step: their readers read the input instead.

    - Dropout in inference mode (what the reference computes: training_mode, opset 12's third input, absent or
      a constant false);
    - a Reshape whose output has its input's shape, dim for dim (torch's GroupNorm export reshapes (N, C, L) to
      (N, G, -1) around an InstanceNormalization: with G = C, as in wav2vec2's feature encoder, that is the
      identity, and left in place it stopped the channels-last layout on both sides of the norm);
    - a Cast to the dtype its input has (GPT-2's export casts the float32 softmax to float32 before the second
      product, which kept the attention from fusing);
    - an Expand whose output has its input's shape, dim for dim (transformers' decoders expand their causal mask
      to (batch, 1, 1, past + 1) from (batch, 1, 1, past + 1): a copy per call, and a bucket plan bound it again
      at every new past length, ~70 us a token of GPT-2's first generation).
    Kept where a mask is read, where the output is a graph output (the output needs its own value) or where a
    subgraph names it (a Loop or If body reads it by name).
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
        if is_default_domain(n) and (n.op_type == "Dropout" and _inference(n, consts)
                                            or n.op_type in ("Reshape", "Cast", "Expand") and _same_shape(n, types)):
            y, masks = n.outputs[0], [m for m in n.outputs[1:] if m]
            if y not in keep and y not in named and not any(readers.get(m) or m in keep for m in masks):
                alias[y] = ins[0]
                continue
        rw.nodes.append(dataclasses.replace(n, inputs=ins) if ins != list(n.inputs) else n)
    return rw


def _same_shape(n: Node, types: dict) -> bool:
    x, y = types.get(n.inputs[0]), types.get(n.outputs[0])
    return isinstance(x, TensorType) and isinstance(y, TensorType) and x.dtype == y.dtype \
        and tuple(x.shape) == tuple(y.shape)


def _inference(n: Node, consts: dict) -> bool:
    if len(n.inputs) < 3 or not n.inputs[2]:
        return True
    mode = consts.get(n.inputs[2])
    return mode is not None and not bool(np.ravel(mode)[0])
