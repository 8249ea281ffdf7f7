"""Every lowering dynshape has, each registered beside the code that implements it. Importing this package
fills the lowering table (`codegen.lowering`); the list below is the whole inventory:

- expr and kernel: `elementwise` (scalar rules, loop nests), `softmax`, `product`, `attention`, `conv`, `pool`;
- native: `codegen.gemm` (MatMul, Gemm through the BLAS), `codegen.row_kernels` (LayerNormalization, Softmax
  rows), `codegen.rnn_kernel` (LSTM, GRU, RNN; also their numpy-path lowering), `movement` (Transpose, Expand,
  Cast, Gather, GatherND, GatherElements), `binary_native` (float32 arithmetic broadcast per call),
  `scatter` (ScatterND, ScatterElements), `range_native` (integer Range with bounds known per key),
  `channels_last` (by wrapped op: `resize`);
- numpy: `codegen.numpy_lowering`.
"""

from dynshape.codegen import gemm, numpy_lowering, rnn_kernel, row_kernels  # noqa: F401
from dynshape.codegen.lower import (  # noqa: F401
    attention,
    binary_native,
    channels_last,
    conv,
    elementwise,
    movement,
    pool,
    product,
    qconv,
    qproduct,
    range_native,
    resize,
    rounding,
    scatter,
    softmax,
)
