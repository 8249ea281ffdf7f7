"""The int8 product item: a `dynshape::DynamicQuantizeMatMul` (passes/quant.py) or `dynshape::QuantizedMatMul`
(passes/qdq.py) with the elementwise group that alone reads it as its epilogue (the bias, GELU, a residual add, a
QDQ model's QuantizeDequantize), one kernel (codegen/lower/qproduct.py). A QuantizedMatMul with an 8-bit result
(QLinearMatMul's) requantizes in its kernel and takes no float epilogue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dynshape.ir.graph import Node
from dynshape.ir.types import TensorType
from dynshape.passes.items import Elementwise, Item, Single
from dynshape.passes.schedule import Match, Schedule, tile_epilogue
from dynshape.passes.values import is_float32

OPS, DOMAIN = ("DynamicQuantizeMatMul", "QuantizedMatMul"), "dynshape"


@dataclass(frozen=True, eq=False)
class QProduct(Item):
    """inputs: the node's (DynamicQuantizeMatMul: x, w, w_zero_point, w_scale; QuantizedMatMul: x, x_scale,
    x_zero_point, w, w_zero_point, multiplier[, y_zero_point]), then the epilogue's operands; `shape` is the
    product's."""

    node: Node | None = None
    epilogue: Elementwise | None = None
    shape: tuple = ()
    kind: ClassVar[str] = "qproduct"

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (self.node, *(self.epilogue.nodes if self.epilogue else ()))


def match_qproduct(s: Schedule, i: int, item: Item) -> Match | None:
    """An int8 product takes, as its epilogue, the elementwise group that alone reads it (a float result only)."""
    if not isinstance(item, Single) or item.node.op_type not in OPS or item.node.domain != DOMAIN:
        return None
    node = item.node
    y = node.outputs[0]
    t = s.type(y)
    if not isinstance(t, TensorType) or not t.shape:
        return None
    shape = tuple(t.shape)
    if not is_float32(t):
        return Match(QProduct(tuple(node.inputs), (y,), node, None, shape), i, frozenset((i,)))
    epi, j = tile_epilogue(s, y, shape)

    def make(epi: Elementwise | None) -> QProduct:
        extra = [z for z in (epi.inputs if epi else ()) if z != y and z not in node.inputs]
        return QProduct((*node.inputs, *dict.fromkeys(extra)), epi.outputs if epi else (y,), node, epi, shape)

    alone = Match(make(None), i, frozenset((i,)))
    return Match(make(epi), j, frozenset((i, j)), alone) if epi is not None else alone
