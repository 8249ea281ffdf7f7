"""dynshape: compile once with symbolic dimensions, run every shape at shape-specialised speed."""

from dynshape import sym
from dynshape.errors import ConstraintViolation, DynshapeError, ModelError, ShapeError
from dynshape.shape import ConstraintStore, any_dim, broadcast_shapes
from dynshape.sym import (
    Cond,
    Expr,
    Symbol,
    bounds,
    ceil_div,
    divides,
    eq,
    is_expr,
    max_,
    min_,
    ne,
    prove,
    simplify,
    solve,
)

__version__ = "0.1.0"

__all__ = [
    "Cond", "ConstraintStore", "ConstraintViolation", "any_dim", "broadcast_shapes",
    "DynshapeError", "Expr", "ModelError", "ShapeError", "Symbol", "bounds",
    "ceil_div", "divides", "eq", "is_expr", "max_", "min_", "ne", "prove", "simplify", "solve", "sym",
]
