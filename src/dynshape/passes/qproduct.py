"""The int8 product item: a `dynshape::DynamicQuantizeMatMul` (passes/quant.py) with the elementwise group that
alone reads it as its epilogue (the bias, GELU, a residual add), one kernel (codegen/lower/qproduct.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dynshape.ir.graph import Node
from dynshape.passes.items import Elementwise, Item, Single
from dynshape.passes.schedule import Match, Schedule, tile_epilogue
from dynshape.passes.values import is_float32

OP, DOMAIN = "DynamicQuantizeMatMul", "dynshape"


@dataclass(frozen=True, eq=False)
class QProduct(Item):
    """inputs: [x, w, w_zero_point, w_scale, *epilogue operands]; `shape` is the product's."""

    node: Node | None = None
    epilogue: Elementwise | None = None
    shape: tuple = ()
    kind: ClassVar[str] = "qproduct"

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (self.node, *(self.epilogue.nodes if self.epilogue else ()))


def match_qproduct(s: Schedule, i: int, item: Item) -> Match | None:
    """A DynamicQuantizeMatMul takes, as its epilogue, the elementwise group that alone reads it."""
    if not isinstance(item, Single) or item.node.op_type != OP or item.node.domain != DOMAIN:
        return None
    node = item.node
    y = node.outputs[0]
    t = s.type(y)
    if not is_float32(t) or not t.shape:
        return None
    shape = tuple(t.shape)
    epi, j = tile_epilogue(s, y, shape)

    def make(epi: Elementwise | None) -> QProduct:
        extra = [z for z in (epi.inputs if epi else ()) if z != y and z not in node.inputs]
        return QProduct((*node.inputs, *dict.fromkeys(extra)), epi.outputs if epi else (y,), node, epi, shape)

    alone = Match(make(None), i, frozenset((i,)))
    return Match(make(epi), j, frozenset((i, j)), alone) if epi is not None else alone
