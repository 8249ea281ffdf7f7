"""Models dynshape builds itself (with onnx.helper), so demos and tests never download anything."""

from dynshape.models.encoder import build_encoder

__all__ = ["build_encoder"]
