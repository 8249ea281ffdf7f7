"""Explicit zero Pads folded away: into the Conv that reads them, or dropped where they pad nothing.

TensorFlow-style "same" padding, as transformers' MobileNetV2 (and TF-converted CNNs) export it, is a Pad node before
each Conv: a constant zero pad of the spatial axes (the conv's own `pads` left at 0), or no pad at all where the
kernel is 1x1. Left in the graph, each one ran as a copy of the feature map into a larger buffer, and it stopped
the channels-last layout on both sides (a Transpose back to channels first, the Pad, a Transpose to channels last
for the Conv: MobileNetV2 at 224x224 0.53x onnxruntime, 1 thread). A Conv reading a zero-padded map computes the
same sums as one that pads the map itself: the padded taps add products with zero.

Exact, but for the sign of a zero: a sum that is exactly zero may be +0 where the explicit pad's -0 products made
it -0 (the kernel skips taps outside the map).
"""

from __future__ import annotations

import dataclasses

from dynshape.ir.graph import Node
from dynshape.ir.opdef import is_default_domain
from dynshape.ir.types import TensorType
from dynshape.passes.layout import Rewrite


def _zero_pad(n: Node, consts: dict, types: dict) -> list[int] | None:
    """The full pads (begins, then ends, one per axis of the input) of a constant-mode Pad by zeros whose pads and
    value are constants, else None."""
    if n.op_type != "Pad" or not is_default_domain(n) or n.attrs.get("mode", "constant") != "constant":
        return None
    x = types.get(n.inputs[0]) if n.inputs else None
    if not isinstance(x, TensorType):
        return None
    r = len(x.shape)
    if "pads" in n.attrs:  # opset < 11: pads and value are attributes
        pads, value, axes = list(n.attrs["pads"]), float(n.attrs.get("value", 0.0)), None
    else:
        named = [n.inputs[k] if len(n.inputs) > k else "" for k in (1, 2, 3)]
        got = [consts.get(v) if v else None for v in named]
        if any(v and c is None for v, c in zip(named, got)) or got[0] is None:
            return None  # a pad, value or axes computed per call
        pads = [int(p) for p in got[0].reshape(-1)]
        value = 0.0 if got[1] is None or got[1].size == 0 else float(got[1].reshape(-1)[0])
        axes = None if got[2] is None or not r else [int(a) % r for a in got[2].reshape(-1)]
    if value != 0.0 or (axes is None and len(pads) != 2 * r):
        return None
    if axes is not None:
        if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
            return None
        full = [0] * (2 * r)
        for i, a in enumerate(axes):
            full[a], full[r + a] = pads[i], pads[len(axes) + i]
        pads = full
    return pads


def _conv_takes(conv: Node, x_rank: int) -> bool:
    return conv.op_type == "Conv" and is_default_domain(conv) and conv.attrs.get("auto_pad", "NOTSET") == "NOTSET" \
        and x_rank >= 3


def fold_pads(nodes: list[Node], types: dict, consts: dict, keep: set[str]) -> Rewrite:
    """A zero Pad that pads nothing is dropped (its readers read its input); one that pads only the spatial axes,
    by amounts >= 0, and that only Convs read (their data input, `auto_pad` NOTSET) is added to each Conv's
    `pads`. Kept where its output is a graph output or a subgraph names it."""
    readers: dict[str, list[Node]] = {}
    named = {x for n in nodes for x in n.free_names()}
    for n in nodes:
        for x in n.inputs:
            if x:
                readers.setdefault(x, []).append(n)
    rw = Rewrite([], {}, {})
    alias: dict[str, str] = {}  # a dropped Pad's output -> its input
    widen: dict[str, tuple[str, list[int]]] = {}  # a folded Pad's output -> (its input, its spatial begins + ends)
    for n in nodes:
        pads = _zero_pad(n, consts, types)
        y = n.outputs[0] if n.outputs else ""
        if pads is None or not y or y in keep or y in named:
            continue
        x = n.inputs[0]
        r = len(types[x].shape)
        if not any(pads):
            alias[y] = x
        elif min(pads) >= 0 and not any(pads[a] or pads[r + a] for a in (0, 1)) and all(
                _conv_takes(c, r) and c.inputs[0] == y and y not in c.inputs[1:] for c in readers.get(y, [])):
            widen[y] = (x, [*pads[2:r], *pads[r + 2:]])
    for n in nodes:
        y = n.outputs[0] if n.outputs else ""
        if y in alias or y in widen:
            continue
        ins = [alias.get(x, x) for x in n.inputs]
        attrs = n.attrs
        if ins and ins[0] in widen:
            ins[0], extra = widen[ins[0]]
            k = len(extra) // 2
            own = list(attrs.get("pads", [0] * (2 * k)))
            attrs = {**attrs, "pads": [int(a) + int(b) for a, b in zip(own, extra)]}
        rw.nodes.append(dataclasses.replace(n, inputs=ins, attrs=attrs) if ins != list(n.inputs) or attrs is not
                        n.attrs else n)
    return rw
