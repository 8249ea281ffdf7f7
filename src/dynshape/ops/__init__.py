"""Every ONNX op dynshape supports. Importing this package defines each op family in the IR's op table
(`dynshape.ir.opdef.OPS`): one module per family, each op's shape rule beside its numpy reference."""

from dynshape.ops import control, conv, elementwise, indexing, movement, nn, reduce, resize, rnn, values  # noqa: F401
