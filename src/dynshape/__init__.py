"""dynshape: compile once with symbolic dimensions, run every shape at the speed of a shape-specialised build."""

from dynshape.errors import ConstraintViolation, DynshapeError, ModelError, ShapeError
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
    sym,
)

__version__ = "0.1.0"

__all__ = [
    "Cond", "ConstraintViolation", "DynshapeError", "Expr", "ModelError", "ShapeError", "Symbol", "bounds",
    "ceil_div", "divides", "eq", "is_expr", "max_", "min_", "ne", "prove", "simplify", "solve", "sym",
]
