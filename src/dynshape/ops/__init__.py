"""Every ONNX op dynshape supports. Importing this package defines each op family in the IR's op table
(`dynshape.ir.opdef.OPS`): one module per family, each op's shape rule beside its numpy reference."""

from dynshape.ops import (  # noqa: F401
    attention,
    control,
    conv,
    elementwise,
    image,
    indexing,
    layout,
    llm,
    losses,
    ml,
    movement,
    nn,
    quantize,
    random,
    reduce,
    resize,
    rnn,
    sequence,
    signal,
    strings,
    training,
    values,
    vision,
    windowed,
)
