"""The op registry: each ONNX op is defined once, here, as an `OpDef`.

An OpDef bundles what every layer needs to know about one op:
- `infer(ctx) -> list[TensorType]`: the shape and dtype rule over `int | Expr` dims (see `ir.infer`).
- `reference(inputs, attrs) -> list[np.ndarray]`: numpy semantics, the oracle every backend is checked against.
- `lower`: filled in by the compiler backends (`codegen`), keyed by backend name.

Families live in sibling modules (`elementwise.py`, `nn.py`, ...); importing `dynshape.ops` registers them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Reference = Callable[[list, dict], list]
Infer = Callable[[Any], list]


@dataclass
class OpDef:
    name: str
    reference: Reference
    infer: Infer | None = None
    domain: str = ""
    lower: dict[str, Any] = field(default_factory=dict)


OPS: dict[tuple[str, str], OpDef] = {}


def register(name: str, *, reference: Reference, infer: Infer | None = None, domain: str = "") -> OpDef:
    """Register an op; registering the same (domain, name) twice is a programming error."""
    key = (domain, name)
    if key in OPS:
        raise RuntimeError(f"op {name!r} registered twice")
    op = OpDef(name=name, reference=reference, infer=infer, domain=domain)
    OPS[key] = op
    return op


def get(name: str, domain: str = "") -> OpDef | None:
    if domain in ("ai.onnx", "onnx"):
        domain = ""
    return OPS.get((domain, name))


def as_array(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else np.asarray(x)
