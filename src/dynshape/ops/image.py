"""ImageDecoder: encoded bytes (uint8[N]) to an (H, W, C) uint8 image, through Pillow.

Pillow is an optional dependency (`pip install dynshape[images]`): a model using ImageDecoder loads without
it, and running the node without Pillow is a clear error naming the package. H and W depend on the data, so
they are fresh dims; C is 3 (RGB or BGR) or 1 (Grayscale).
"""

from __future__ import annotations

import io

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType

U8 = np.dtype(np.uint8)
_FORMATS = {"RGB": 3, "BGR": 3, "Grayscale": 1}


def _image_decoder_ref(inputs: list, attrs: dict) -> list:
    try:
        from PIL import Image
    except ImportError:
        raise RuntimeError("ImageDecoder needs Pillow: pip install pillow (or dynshape[images])") from None
    fmt = attrs.get("pixel_format", "RGB")
    img = Image.open(io.BytesIO(np.asarray(inputs[0], U8).tobytes()))
    if fmt == "Grayscale":
        return [np.asarray(img.convert("L"), U8)[:, :, None]]
    rgb = np.asarray(img.convert("RGB"), U8)
    return [np.ascontiguousarray(rgb[:, :, ::-1]) if fmt == "BGR" else rgb]


def _image_decoder_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    fmt = ctx.attr("pixel_format", "RGB")
    if fmt not in _FORMATS:
        ctx.error(f"pixel_format must be RGB, BGR or Grayscale, got {fmt!r}")
    if x.rank != 1 or x.dtype != U8:
        ctx.error(f"the encoded stream must be uint8[N], got {x.dtype}{list(x.shape)}")
    return [TensorType(U8, (ctx.fresh("image_height"), ctx.fresh("image_width"), _FORMATS[fmt]))]


register("ImageDecoder", reference=_image_decoder_ref, infer=_image_decoder_rule)
