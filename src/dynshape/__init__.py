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

_LAZY = {
    "load_onnx": ("dynshape.frontends.onnx", "load_onnx"),
    "compile": ("dynshape.runtime.executable", "compile"),
    "Executable": ("dynshape.runtime.executable", "Executable"),
    "Graph": ("dynshape.ir.graph", "Graph"),
    "TensorType": ("dynshape.ir.types", "TensorType"),
    "load": ("dynshape.compiler.artifact", "load"),
    "save": ("dynshape.compiler.artifact", "save"),
    "from_torch": ("dynshape.frontends.torch_export", "from_torch"),
    "quantize_dynamic": ("dynshape.passes.quant", "quantize_dynamic"),
}


def __getattr__(name: str):
    """The graph, frontend and compiler layers load on first use, so `import dynshape` stays light."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'dynshape' has no attribute {name!r}")

__all__ = [
    "Cond", "ConstraintStore", "ConstraintViolation", "DynshapeError", "Executable", "Expr", "Graph", "ModelError",
    "ShapeError", "Symbol", "TensorType", "any_dim", "bounds", "broadcast_shapes", "ceil_div", "compile", "divides",
    "eq", "from_torch", "is_expr", "load", "load_onnx", "max_", "min_", "ne", "prove", "quantize_dynamic", "save",
    "simplify", "solve", "sym",
]
