"""The op table: what the IR's shape inference and reference executor need to know about each op.

An `OpDef` bundles, for one ONNX op:
- `infer(ctx) -> list[TensorType]`: the shape and dtype rule over `int | Expr` dims (see `ir.infer`);
- `reference(inputs, attrs) -> list[np.ndarray]`: numpy semantics, the oracle every backend is checked against.

The table lives in the IR because inference and the interpreter look ops up by name; the definitions live
one layer up, in `dynshape.ops` (one module per family, each op's rule beside its reference), and fill the
table when that package is imported (the frontends import it). How an op is *compiled* is not here: each
lowering is registered beside the kernel that implements it (`dynshape.codegen.lowering`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dynshape.errors import ModelError

Reference = Callable[[list, dict], list]
Infer = Callable[[Any], list]


@dataclass(frozen=True)
class OpDef:
    name: str
    reference: Reference
    infer: Infer | None = None
    domain: str = ""


OPS: dict[tuple[str, str], OpDef] = {}

# Ops whose outputs are not a function of their inputs (random draws; Dropout in training mode): never folded,
# deduplicated or computed once per shape.
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli", "Dropout"})


def _domain(domain: str) -> str:
    return "" if domain in ("ai.onnx", "onnx") else domain


def register(name: str, *, reference: Reference, infer: Infer | None = None, domain: str = "") -> OpDef:
    """Define an op; defining the same (domain, name) twice is a programming error."""
    key = (_domain(domain), name)
    if key in OPS:
        raise RuntimeError(f"op {name!r} registered twice")
    op = OpDef(name=name, reference=reference, infer=infer, domain=key[0])
    OPS[key] = op
    return op


def lookup(name: str, domain: str = "") -> OpDef | None:
    """The op's definition, or None when dynshape does not define it."""
    return OPS.get((_domain(domain), name))


def require(name: str, domain: str, where: str) -> OpDef:
    """The op's definition, or a ModelError naming `where` (an empty table means `dynshape.ops` was never
    imported: a graph built by hand must import it, as the frontends do)."""
    op = lookup(name, domain)
    if op is None:
        hint = "" if OPS else " (no op is defined: `import dynshape.ops` first)"
        raise ModelError(f"{where}: op {name!r} is not supported by dynshape{hint}")
    return op
