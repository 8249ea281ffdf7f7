"""The schedule fusion rules work on, and what a rule is: data the driver applies, one pass per rule.

The driver (`Schedule.apply`) owns the bookkeeping every rule needs: who produces a value, who reads it, which
items a match absorbs, and the conflicts between matches of one pass (an item is absorbed at most once). A rule
only says, for one item, what bigger item it becomes and which neighbours that absorbs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dynshape.ir.graph import Graph, Node
from dynshape.ir.types import TensorType
from dynshape.options import Options
from dynshape.passes.items import Elementwise, Item
from dynshape.passes.values import broadcast_pattern, row_pattern, scalar_const


class Schedule:
    """Items in execution order plus the lookups rules ask for (recomputed per rule pass)."""

    def __init__(self, items: list[Item], graph: Graph, consumers: dict[str, list[Node]], graph_outputs: set[str],
                 options: Options | None = None):
        self.items = items
        self.options = options  # the build's (rules whose match depends on the precision read it)
        self.graph = graph
        self.consumers = consumers
        self.graph_outputs = graph_outputs
        self.slot_of = {o: i for i, item in enumerate(items) for o in item.produced}
        self.producer = {o: n for item in items for n in item.nodes for o in n.outputs if o}

    def item_reading(self, name: str) -> int | None:
        """The slot of the item holding the first reader of `name` (None when nothing reads it)."""
        users = self.consumers.get(name, [])
        return self.slot_of.get(users[0].outputs[0]) if users and users[0].outputs else None

    def read_only_by(self, name: str, slot: int) -> bool:
        """Every reader of `name` sits in item `slot`."""
        return all(u.outputs and self.slot_of.get(u.outputs[0]) == slot for u in self.consumers.get(name, []))

    def sole_reader(self, name: str) -> Node | None:
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and name not in self.graph_outputs else None

    def type(self, name: str) -> TensorType | None:
        t = self.graph.types.get(name)
        return t if isinstance(t, TensorType) else None

    def apply(self, rule: Rule) -> Schedule:
        """One pass of `rule` over the items; matches that would absorb an item twice are skipped."""
        made: dict[int, Item] = {}
        taken: set[int] = set()
        for i, item in enumerate(self.items):
            if i in taken:
                continue
            m = rule.match(self, i, item)
            if m is not None and m.absorbed & taken:  # a neighbour went to an earlier match: the item alone
                m = m.alone
            if m is None or m.absorbed & taken:
                continue
            made[m.at] = m.item
            taken |= m.absorbed
        items = [made.get(i, item) for i, item in enumerate(self.items) if i not in taken or i in made]
        return Schedule(items, self.graph, self.consumers, self.graph_outputs, self.options)


@dataclass(frozen=True)
class Match:
    item: Item  # the new item
    at: int  # where it runs (one of the absorbed slots)
    absorbed: frozenset[int]  # the slots it replaces
    alone: Match | None = None  # the item without its neighbours, when one of them is already taken


@dataclass(frozen=True)
class Rule:
    name: str
    option: str  # the Options field that switches it on
    match: Callable[[Schedule, int, Item], Match | None]




def tile_epilogue(s: Schedule, y: str, shape: tuple) -> tuple[Elementwise | None, int | None]:
    """The elementwise group that alone reads `y` and can run on each tile of a product as its epilogue (operands:
    full tensors, per-channel vectors or one value), and its slot; (None, None) where there is none. What every
    product-like rule (float products, convolutions, int8 products) absorbs."""
    j = s.item_reading(y)
    epi = s.items[j] if j is not None else None
    if not (isinstance(epi, Elementwise) and epi.shape == shape and y not in s.graph_outputs
            and len(epi.outputs) == 1 and y not in epi.outputs and s.read_only_by(y, j)
            and all(row_pattern(broadcast_pattern(tuple(s.type(z).shape), shape) or (False,))
                    or scalar_const(z, s.graph) is not None for z in epi.inputs if z != y)):
        return None, None
    return epi, j
