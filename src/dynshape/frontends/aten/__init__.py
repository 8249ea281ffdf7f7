"""ATen-level FX graphs (from aot_autograd or torch.export) as dynshape Graphs.

`decompositions()` is the table both torch entry points trace with: torch's core ATen decompositions, minus the
ops this frontend lowers whole because dynshape has a better-fitting op (`_safe_softmax`, `hardswish`,
`hardsigmoid`, `upsample_nearest2d`, `lstm`,
scaled dot-product attention). `Converter(...).run()` does the conversion (see `convert.py`);
`finish()` runs dynshape's shape inference and adds torch's size facts to the signature.
"""

from __future__ import annotations

import functools

from dynshape.frontends.aten import ops_attention, ops_math, ops_nn, ops_tensor  # noqa: F401 - registers the handlers
from dynshape.frontends.aten.convert import (
    HANDLERS,
    Conversion,
    Converter,
    PlaceholderSpec,
    np_dtype,
    op_name,
    to_numpy,
    unsupported_error,
)
from dynshape.frontends.aten.symbols import SymbolTable, Unsupported, condition, range_of, symbol_name, to_expr

KEEP = ("_safe_softmax.default", "hardswish.default", "hardsigmoid.default", "upsample_nearest2d.default",
        "upsample_nearest2d.vec", "upsample_bilinear2d.vec", "lstm.input", "gru.input",
        "_scaled_dot_product_flash_attention_for_cpu.default")


def decompositions() -> dict:
    """torch's core ATen decomposition table without the ops this frontend maps whole (see KEEP); a fresh dict
    each call (callers may edit it), built once per process (about 0.1 s)."""
    return dict(_decompositions())


@functools.cache
def _decompositions() -> dict:
    import torch
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for name in KEEP:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload, None)
        if op is not None:  # lstm stays whole even before dynshape has LSTM: its decomposition unrolls time
            table.pop(op, None)
    return table


def has_op(name: str) -> bool:
    """Whether dynshape defines the ONNX op `name` (looked up in the IR's op table)."""
    import dynshape.ops  # noqa: F401 - defines every op family in the table
    from dynshape.ir.opdef import lookup

    return lookup(name) is not None


def finish(conv: Conversion, facts: list | None = None) -> Conversion:
    """State facts `(condition, text, origin)` on the input symbols as the graph's requirements
    (`Graph.requires`, which inference adds to the signature and dynshape's binder checks per call), then infer
    the graph. Conditions over sizes no input carries become notes: nothing could check them per call."""
    from dynshape.ir.graph import Fact
    from dynshape.ir.infer import infer_graph
    from dynshape.sym import Expr, prove

    names = {s for v in conv.graph.inputs for d in (v.shape or ()) if isinstance(d, Expr) for s in d.free_symbols}
    for cond, text, origin in [*(facts or []), *conv.facts]:
        if isinstance(cond, bool) or prove(cond) is True:
            continue
        if not cond.free_symbols <= names:
            conv.notes.append(f"not checked per call (uses sizes no input carries): {text} [{origin}]")
            continue
        conv.graph.requires.append(Fact("require", text, origin, cond))
    infer_graph(conv.graph)
    return conv


def lowered_ops() -> list[str]:
    """Every ATen overload (or packet) this frontend lowers."""
    return sorted(HANDLERS)


__all__ = [
    "HANDLERS", "KEEP", "Conversion", "Converter", "PlaceholderSpec", "SymbolTable", "Unsupported", "condition",
    "decompositions", "finish", "has_op", "lowered_ops", "np_dtype", "op_name", "range_of", "symbol_name", "to_expr",
    "to_numpy", "unsupported_error",
]
