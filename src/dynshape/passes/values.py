"""What passes and lowerings ask about a graph's values: constants, float32-ness, broadcast patterns."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dynshape.ir import opdef
from dynshape.ir.graph import Graph, Node
from dynshape.ir.opdef import Movement
from dynshape.ir.types import TensorType
from dynshape.shape.broadcast import same_dim


def dataflow(nodes: list[Node]) -> tuple[dict[str, Node], dict[str, list[Node]]]:
    """(value -> the node that makes it, value -> the nodes that read it, subgraphs' free names included): what a
    rewrite that matches chains of nodes looks up."""
    producer = {o: n for n in nodes for o in n.outputs if o}
    readers: dict[str, list[Node]] = {}
    for n in nodes:
        for x in (*n.inputs, *n.free_names()):
            if x:
                readers.setdefault(x, []).append(n)
    return producer, readers


def is_view(n: Node) -> bool:
    """Whether n's output is its input's buffer reinterpreted (a plan makes it a view, no copy)."""
    op = opdef.of(n)
    return op is not None and op.movement is Movement.VIEW


def is_movement(n: Node) -> bool:
    """Whether n is pure data movement: a view, or a Transpose (a copy, but of unchanged values)."""
    op = opdef.of(n)
    return op is not None and op.movement is not Movement.NONE


def reduction_axes(n: Node, value: Callable[[str], np.ndarray | None]) -> list[int] | None:
    """A Reduce* node's axes as written: its `axes` attribute, or (opset 18) its second input when `value(name)`
    knows that constant; None when neither."""
    axes = n.attrs.get("axes")
    if axes is None and len(n.inputs) > 1 and n.inputs[1]:
        c = value(n.inputs[1])
        axes = None if c is None else c.reshape(-1)
    return None if axes is None else [int(a) for a in axes]


def is_float32(t: object) -> bool:
    return isinstance(t, TensorType) and np.dtype(t.dtype) == np.float32


def tensor_type(graph: Graph, name: str) -> TensorType | None:
    t = graph.types.get(name)
    return t if isinstance(t, TensorType) else None


def const_value(name: str, graph: Graph) -> np.ndarray | None:
    """The numeric value of an initializer or of a value inference knows exactly, else None."""
    c = graph.initializers.get(name)
    if c is None:
        t = graph.types.get(name)
        c = t.value if isinstance(t, TensorType) and t.value is not None and t.value.dtype != object else None
    return c


def scalar_const(name: str, graph: Graph) -> float | None:
    """The value of a one-element numeric constant, else None (such operands are inlined as literals)."""
    c = const_value(name, graph)
    if c is None or c.size != 1 or c.dtype.kind not in "biuf":
        return None
    return float(np.asarray(c).reshape(-1)[0])


def broadcast_pattern(shape: tuple, out: tuple) -> tuple | None:
    """Per output axis: True where `shape` (right-aligned) spans it, False where it broadcasts; None if neither."""
    if len(shape) > len(out):
        return None
    pad = len(out) - len(shape)
    pattern = []
    for k, d in enumerate(out):
        if k < pad:
            pattern.append(False)
            continue
        e = shape[k - pad]
        if isinstance(e, int) and e == 1 and not (isinstance(d, int) and d == 1):
            pattern.append(False)
        elif same_dim(e, d):
            pattern.append(True)
        else:
            return None
    return tuple(pattern)


def row_pattern(pat: tuple) -> bool:
    """Operands an epilogue can index as [row * n + j] (full), [j] (a row vector) or [0] (one value)."""
    return all(pat) or not any(pat[:-1])
