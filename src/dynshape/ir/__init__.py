"""The graph IR: types, graphs, shape inference and the reference executor."""

from dynshape.ir.graph import Fact, Graph, MemoryBound, Node, Signature, Value
from dynshape.ir.types import OptionalType, SequenceType, TensorType

__all__ = ["Fact", "Graph", "MemoryBound", "Node", "OptionalType", "SequenceType", "Signature", "TensorType", "Value"]
