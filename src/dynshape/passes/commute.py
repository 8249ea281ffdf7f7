"""A 1x1 convolution after an upsampling Resize runs before it, on the smaller map.

A UNet's or an FPN's decoder upsamples and then mixes channels with a 1x1 convolution (Upsample(2, bilinear) then
Conv(1x1)): the convolution then runs on 4x the pixels it needs. A Resize is linear in its input and acts on each
channel alone, and a pointwise convolution is linear in the channels of each pixel alone, so the two commute:
Conv(Resize(x)) = Resize(Conv(x)) for the weights; and as every output value of a nearest, linear or cubic Resize
is a combination of input values whose weights sum to 1 (outside tf_crop_and_resize, whose extrapolated pixels
are a constant), the bias commutes too. The convolution then computes a quarter of the multiply-adds (at scale 2)
and the Resize moves the convolution's output channels instead of its input's.

Not bit for bit: the float32 sums are taken in another order (each output a sum of the same products rounded
differently), a few ulp of the values (tests compare against the reference with float32 tolerances).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dynshape.ir.graph import Node
from dynshape.ir.opdef import is_default_domain
from dynshape.ir.types import TensorType
from dynshape.passes.layout import Rewrite

_MODES = ("nearest", "linear", "cubic")


def pointwise_before_resize(nodes: list[Node], types: dict, consts: dict, keep: set[str],
                            opset: int = 13) -> Rewrite:
    """Each Resize (opset 11 and later) that only scales the spatial axes up, by constant scales or sizes, and
    whose output only a 1x1 / stride 1 / unpadded / ungrouped Conv with constant weights reads: the Conv reads
    the Resize's input, and a Resize of the Conv's output makes the Conv's old output."""
    if opset < 11:  # (Resize-10 reads (X, scales): left as written)
        return Rewrite(list(nodes), {}, {})
    readers: dict[str, int] = {}
    for n in nodes:
        for x in (*n.inputs, *n.free_names()):
            readers[x] = readers.get(x, 0) + 1
    producer = {o: n for n in nodes for o in n.outputs if o}
    rw = Rewrite([], {}, {})
    moved: dict[int, list[Node]] = {}  # id(conv) -> [conv on the small map, resize]
    dropped: set[int] = set()
    for conv in nodes:
        resize = producer.get(conv.inputs[0]) if conv.inputs else None
        if resize is None or id(resize) in dropped or not _pointwise(conv, consts) \
                or readers.get(conv.inputs[0]) != 1 or conv.inputs[0] in keep:
            continue
        plan = _upsampling(resize, types, consts)
        if plan is None:
            continue
        x, sizes = plan
        oc = int(consts[conv.inputs[1]].shape[0])
        t_x, t_y = types[x], types.get(conv.outputs[0])
        if not isinstance(t_y, TensorType):
            continue
        small = rw.fresh(conv.outputs[0], types)
        rw.types[small] = TensorType(t_y.dtype, (t_x.shape[0], oc, *t_x.shape[2:]))
        ins = list(resize.inputs) + [""] * (4 - len(resize.inputs))
        ins[0] = small
        if sizes is not None:  # the sizes name the channels: the conv's output count now
            name = rw.fresh(ins[3], types)
            new = sizes.copy()
            new[1] = oc
            rw.consts[name] = new
            rw.types[name] = TensorType(new.dtype, new.shape)
            ins[3] = name
        while ins and not ins[-1]:
            ins.pop()
        moved[id(conv)] = [dataclasses.replace(conv, inputs=[x, *conv.inputs[1:]], outputs=[small]),
                           dataclasses.replace(resize, inputs=ins, outputs=[conv.outputs[0]])]
        dropped.add(id(resize))
    for n in nodes:
        if id(n) in dropped:
            continue
        rw.nodes.extend(moved.get(id(n), [n]))
    return rw


def _pointwise(conv: Node, consts: dict) -> bool:
    """A Conv with constant weights (OC, C, 1, 1) (and bias): stride 1, no padding, no dilation, one group."""
    if conv.op_type != "Conv" or not is_default_domain(conv) or len(conv.inputs) < 2 or len(conv.outputs) != 1:
        return False
    w = consts.get(conv.inputs[1])
    a = conv.attrs
    return (w is not None and w.ndim == 4 and w.shape[2:] == (1, 1) and w.dtype == np.float32
            and (len(conv.inputs) < 3 or not conv.inputs[2] or conv.inputs[2] in consts)
            and int(a.get("group", 1)) == 1 and not any(a.get("pads", [0] * 4))
            and all(int(v) == 1 for v in (*a.get("strides", [1, 1]), *a.get("dilations", [1, 1])))
            and a.get("auto_pad", "NOTSET") in ("NOTSET", "VALID"))


def _upsampling(resize: Node, types: dict, consts: dict) -> tuple[str, np.ndarray | None] | None:
    """(its input, its constant sizes or None) where `resize` scales only the spatial axes of a rank-4 float
    tensor, each by at least 1, with interpolation weights that sum to 1; else None."""
    a = resize.attrs
    if resize.op_type != "Resize" or not is_default_domain(resize) or len(resize.outputs) != 1 \
            or a.get("mode", "nearest") not in _MODES \
            or a.get("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize" \
            or int(a.get("antialias", 0)) or a.get("axes") is not None \
            or a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        return None
    x = resize.inputs[0]
    t = types.get(x)
    if not isinstance(t, TensorType) or len(t.shape) != 4 or np.dtype(t.dtype) != np.float32 \
            or not isinstance(t.shape[1], int):
        return None
    scales = consts.get(resize.inputs[2]) if len(resize.inputs) > 2 and resize.inputs[2] else None
    sizes = consts.get(resize.inputs[3]) if len(resize.inputs) > 3 and resize.inputs[3] else None
    if scales is not None and scales.size == 4 and sizes is None:
        s = np.asarray(scales, np.float64)
        return (x, None) if s[0] == 1 and s[1] == 1 and s[2] >= 1 and s[3] >= 1 else None
    if sizes is not None and sizes.size == 4 and (scales is None or scales.size == 0):
        z = np.asarray(sizes).astype(np.int64)
        grow = all(isinstance(d, int) and int(v) >= d for d, v in zip(t.shape[2:], z[2:]))
        return (x, np.asarray(sizes)) if isinstance(t.shape[0], int) and z[0] == t.shape[0] \
            and z[1] == t.shape[1] and grow else None
    return None
