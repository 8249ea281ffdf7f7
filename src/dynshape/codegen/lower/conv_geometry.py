"""A convolution's geometry as the conv kernels read it (sizes, kernel, strides, dilations, begin pads, groups),
and the one rewrite of it that changes no byte: a column one pixel wide as a row."""

from __future__ import annotations

from dynshape.codegen.lowering import LowerCtx
from dynshape.ops.conv import window_out, window_params
from dynshape.passes.items import Conv
from dynshape.passes.values import const_value


def geometry(cv: Conv, ctx: LowerCtx) -> dict:
    """The convolution's sizes as `int | sym.Expr`: input/output spatial sizes, kernel, strides, dilations,
    begin pads (SAME_* pads follow from the input size), channels and groups. 1-D is 2-D with H = KH = 1."""
    g, node = ctx.graph, cv.node
    x, y = g.types[node.inputs[0]], g.types[node.outputs[0]]
    w = const_value(node.inputs[1], g)
    nd = len(x.shape) - 2
    strides, dilations, pbs, pes, auto_pad = window_params(node.attrs.get, nd)
    kernel = list(w.shape[2:])
    spatial = list(x.shape[1:1 + nd])
    begins = [window_out(h, k, s, d, pb, pe, auto_pad, False)[1]
              for h, k, s, d, pb, pe in zip(spatial, kernel, strides, dilations, pbs, pes)]
    out = list(y.shape[1:1 + nd])
    if nd == 1:
        spatial, out, kernel, strides, dilations, begins = ([1, *v] for v in (spatial, out, kernel, strides,
                                                                              dilations, begins))
        strides[0] = dilations[0] = 1
        begins[0] = 0
    groups = int(node.attrs.get("group", 1))
    c, oc = x.shape[-1], y.shape[-1]
    return {"N": x.shape[0], "H": spatial[0], "W": spatial[1], "C": c, "OH": out[0], "OW": out[1], "OC": oc,
            "KH": kernel[0], "KW": kernel[1], "SH": int(strides[0]), "SW": int(strides[1]),
            "DH": int(dilations[0]), "DW": int(dilations[1]), "PT": begins[0], "PL": begins[1], "G": groups,
            "CG": c // groups, "OCG": oc // groups}


def columns_for_rows(geo: dict) -> dict:
    """A KH x 1 conv over a map one pixel wide (W = OW = 1, no side pads) as the 1 x KH conv over one row of H
    pixels: the same bytes (channels-last pixels (h, 0) and (0, h) both lie at h x C; the weights' taps (kh, 0) and
    (0, kh) both at tap kh), so only the geometry changes. Why: the tiles' pixel blocks follow the output rows, and
    rows one pixel wide ran magika's 5 x 1 conv over 508 x 1 at batch 1 at 75 GF/s (step_profile, hot), 96 as one
    row of 508 (the whole call 1.055x faster, bench/ab_versions.py; at batch 2 and 4 the blocks already spanned
    the images' rows: 1.01x)."""
    if not (geo["W"] == 1 and geo["OW"] == 1 and geo["KW"] == 1 and geo["PL"] == 0 and geo["KH"] != 1):
        return geo
    swap = {"H": "W", "OH": "OW", "KH": "KW", "SH": "SW", "DH": "DW", "PT": "PL"}
    swap.update({b: a for a, b in swap.items()})
    return {swap.get(k, k): v for k, v in geo.items()}
