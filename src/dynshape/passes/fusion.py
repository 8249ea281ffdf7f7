"""Fusion: live nodes -> a schedule of items (`passes.items`), by elementwise grouping then rules as data.

1. `group_elementwise` partitions the nodes: chains of elementwise ops over one iteration shape become
   `Elementwise` items (one loop nest, one pass over memory), every other node a `Single`. Which ops are
   elementwise is not known here: the caller passes `fusible(node, graph)`, backed by the lowering table
   (an op with an "expr" lowering that accepts the node), so adding a compiled elementwise op touches only
   the place that prints it.
2. Each rule of `RULES` (in order, each switched by an `Options` field) looks at every item of the schedule
   and may replace it and some of its neighbours by one bigger item. The driver (`Schedule.apply`) owns the
   bookkeeping every rule needs: who produces a value, who reads it, which items a match absorbs, and the
   conflicts between matches of one pass (an item is absorbed at most once).

A group runs at the position of its first node, so a node may join a group only when every input it takes
from outside the group is already computed there. Values an item produces that anything outside it reads
(or that are graph outputs) are its outputs; the others never reach memory.
"""

from __future__ import annotations

from collections.abc import Callable

from dynshape.ir.graph import Graph, Node
from dynshape.ir.opdef import is_default_domain
from dynshape.ir.types import TensorType
from dynshape.options import Options
from dynshape.passes.items import Elementwise, Item, Single
from dynshape.passes.rules import RULES
from dynshape.passes.schedule import Rule, Schedule
from dynshape.passes.values import broadcast_pattern

Fusible = Callable[[Node, Graph], bool]


# ---- elementwise grouping ----------------------------------------------------------------------------------
def _groupable(node: Node, graph: Graph, fusible: Fusible) -> bool:
    """Structurally an elementwise node (one output with the broadcast shape of its named tensor inputs), and
    an op whose expression rule takes it (ONNX's, or dynshape's own: QuantizeDequantize)."""
    if not (is_default_domain(node) or node.domain == "dynshape") or len(node.outputs) != 1 or not node.inputs \
            or "" in node.inputs:
        return False
    out = graph.types.get(node.outputs[0])
    ins = [graph.types.get(x) for x in node.inputs]
    if not isinstance(out, TensorType) or not all(isinstance(t, TensorType) for t in ins):
        return False
    if any(broadcast_pattern(tuple(t.shape), tuple(out.shape)) is None for t in ins):
        return False
    return fusible(node, graph)


def group_elementwise(nodes: list[Node], graph: Graph, known: set[str], fusible: Fusible) -> list[Item]:
    """Partition live nodes into Singles and Elementwise groups (in execution order)."""
    pos = {id(n): i for i, n in enumerate(nodes)}
    producer = {o: n for n in nodes for o in n.outputs if o}
    consumers = readers(nodes)
    graph_outputs = {v.name for v in graph.outputs}
    group_of: dict[int, list[Node]] = {}  # id(node) -> its group's node list
    first: dict[int, int] = {}  # id(group list) -> position of its first node
    shape_of: dict[int, tuple] = {}
    order: list[Node | list[Node]] = []
    for n in nodes:
        if not _groupable(n, graph, fusible):
            order.append(n)
            continue
        out_shape = tuple(graph.types[n.outputs[0]].shape)
        target = None
        for x in n.inputs:
            p = producer.get(x)
            g = group_of.get(id(p)) if p is not None else None
            if g is None or shape_of[id(g)] != out_shape:
                continue
            # every outside input must exist before the group's first node
            if all(q is None or y in known or group_of.get(id(q)) is g or pos[id(q)] < first[id(g)]
                   for y in n.inputs for q in [producer.get(y)]):
                target = g
                break
        if target is None:
            target = []
            first[id(target)], shape_of[id(target)] = pos[id(n)], out_shape
            order.append(target)
        target.append(n)
        group_of[id(n)] = target
    items: list[Item] = []
    for entry in order:
        if isinstance(entry, Node):
            items.append(single(entry))
        elif len(entry) == 1 and entry[0].op_type == "Identity":
            items.append(single(entry[0]))
        else:
            items.append(_elementwise(entry, shape_of[id(entry)], consumers, graph_outputs, group_of))
    return items


def single(node: Node) -> Single:
    return Single(tuple(x for x in node.inputs if x), tuple(o for o in node.outputs if o), node)


def readers(nodes: list[Node]) -> dict[str, list[Node]]:
    """Value name -> the nodes that read it, in order (a node with subgraphs reads what its bodies capture)."""
    out: dict[str, list[Node]] = {}
    for n in nodes:
        for x in (*n.inputs, *sorted(n.free_names())):
            if x:
                out.setdefault(x, []).append(n)
    return out


def _elementwise(group: list[Node], shape: tuple, consumers: dict, graph_outputs: set, group_of: dict) -> Elementwise:
    produced = {o for n in group for o in n.outputs}
    inputs: list[str] = []
    for n in group:
        for x in n.inputs:
            if x not in produced and x not in inputs:
                inputs.append(x)
    outputs = [n.outputs[0] for n in group
               if n.outputs[0] in graph_outputs or any(group_of.get(id(c)) is not group
                                                       for c in consumers.get(n.outputs[0], []))]
    return Elementwise(tuple(inputs), tuple(outputs), tuple(group), shape)


# ---- the driver --------------------------------------------------------------------------------------------
def fuse(nodes: list[Node], graph: Graph, known: set[str], options: Options, fusible: Fusible,
         rules: tuple[Rule, ...] | None = None) -> list[Item]:
    """The schedule of `nodes`: elementwise groups, then every rule whose option is on, in order."""
    sched = Schedule(group_elementwise(nodes, graph, known, fusible), graph, readers(nodes),
                     {v.name for v in graph.outputs}, options)
    for rule in RULES if rules is None else rules:
        if getattr(options, rule.option):
            sched = sched.apply(rule)
    return sched.items
