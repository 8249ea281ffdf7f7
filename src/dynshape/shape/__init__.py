"""Symbolic shapes: tuples of `int | Expr`, broadcasting, anonymous dims, and the constraint store."""

from dynshape.shape.broadcast import any_dim, broadcast_shapes
from dynshape.shape.store import ConstraintStore, Fact

__all__ = ["ConstraintStore", "Fact", "any_dim", "broadcast_shapes"]
