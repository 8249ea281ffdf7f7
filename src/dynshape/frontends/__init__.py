"""Model importers. Only ONNX for now."""

from dynshape.frontends.onnx import load_onnx

__all__ = ["load_onnx"]
