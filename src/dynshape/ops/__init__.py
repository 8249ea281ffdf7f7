"""Every ONNX op dynshape supports: importing this package registers all op families in `registry.OPS`."""

from dynshape.ops import control, conv, elementwise, nn, reduce, registry, tensor  # noqa: F401
