"""ChannelsLast: an ONNX spatial op (Conv, pools, Resize, ...) computed on channels-last data.

The compiler runs CNNs in one activation layout, channels last (N, *spatial, C): a 1x1 convolution is then a
plain product of pixel rows by the weights, depthwise convolutions and pools vectorise over the contiguous
channels, and a channel concat is a column offset. `passes.layout` wraps each spatial op as
`dynshape::ChannelsLast(op=...)` between two Transposes and cancels the Transposes that meet. The wrapper's
semantics are exactly the inner op's on the channels-first view: input 0 (and output 0) are channels-last,
every other input (weights, bias, Resize's scales) keeps the ONNX meaning.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.ir import opdef
from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType

DOMAIN = "dynshape"


def to_last(rank: int) -> list[int]:
    """The Transpose perm channels-first -> channels-last: (N, C, *S) -> (N, *S, C)."""
    return [0, *range(2, rank), 1]


def to_first(rank: int) -> list[int]:
    """The inverse: (N, *S, C) -> (N, C, *S)."""
    return [0, rank - 1, *range(1, rank - 1)]


def _inner(attrs: dict) -> tuple[opdef.OpDef, dict]:
    op = opdef.lookup(attrs["op"])
    if op is None:
        raise KeyError(f"ChannelsLast wraps an unknown op {attrs['op']!r}")
    return op, {k: v for k, v in attrs.items() if k != "op"}


def _reference(inputs: list, attrs: dict) -> list:
    op, inner = _inner(attrs)
    x = inputs[0]
    outs = op.reference([np.moveaxis(x, -1, 1), *inputs[1:]], inner)
    return [np.ascontiguousarray(np.moveaxis(outs[0], 1, -1)), *outs[1:]]


class _FirstView:
    """The inference context as the inner op's rule must see it: input 0 channels-first."""

    def __init__(self, ctx: InferCtx):
        self._ctx = ctx
        self.op_type = ctx.attr("op", None)
        t = ctx.inputs[0]
        perm = to_first(len(t.shape))
        first = TensorType(t.dtype, tuple(t.shape[p] for p in perm), None)
        self.inputs = [first, *ctx.inputs[1:]]

    def attr(self, name: str, default: Any = None) -> Any:
        return default if name == "op" else self._ctx.attr(name, default)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def _infer(ctx: InferCtx) -> list:
    op, _ = _inner({"op": ctx.attr("op", None)})
    outs = op.infer(_FirstView(ctx))
    y = outs[0]
    perm = to_last(len(y.shape))
    return [TensorType(y.dtype, tuple(y.shape[p] for p in perm)), *outs[1:]]


register("ChannelsLast", reference=_reference, infer=_infer, domain=DOMAIN)
