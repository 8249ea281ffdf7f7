"""The lowering table: how each op (or fused kind) is compiled, per backend.

Every lowering is registered by an explicit `register_lowering(...)` call beside the code that implements it
(the expression rule beside the C math it prints to, the kernel emitter beside its kernel), so adding a
compiled op touches one place. `dynshape.codegen.lower` imports the modules that hold them, one explicit list.

Backends, in the order the compiler prefers them:
- "expr": a scalar rule (operands -> kernel-IR expression); elementwise ops with one join fused loop nests;
- "kernel": a fused item (see `dynshape.passes.items`) -> a kernel-IR loop nest, printed to C;
- "native": a pre-built C entry point bound to the call's buffers when a plan is bound (BLAS, row kernels);
- "numpy": a faster numpy/BLAS implementation than the reference, for what runs in Python.
What has none of these runs its reference, and `explain` says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Backend = Literal["expr", "kernel", "native", "numpy"]
BACKENDS: tuple[Backend, ...] = ("expr", "kernel", "native", "numpy")


class Unsupported(Exception):  # noqa: N818 - a verdict, not a failure: the caller falls back and records why
    """A lowering declines a node or item; the message says why (shown by `explain`)."""


@dataclass(frozen=True)
class Lowering:
    op: str
    backend: Backend
    rule: Callable[..., Any]
    domain: str = ""

    @property
    def where(self) -> str:
        return f"{self.rule.__module__}.{getattr(self.rule, '__qualname__', self.rule)}"


_TABLE: dict[tuple[str, str, str], Lowering] = {}


def register_lowering(op: str, backend: Backend, rule: Callable[..., Any], *, domain: str = "") -> Callable[..., Any]:
    """Register `rule` as `op`'s lowering for `backend`; twice for one (op, backend) is a programming error."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; one of {BACKENDS}")
    key = ("" if domain in ("ai.onnx", "onnx") else domain, op, backend)
    if key in _TABLE:
        raise RuntimeError(f"{op!r} has two {backend!r} lowerings: {_TABLE[key].where} and {rule.__module__}")
    _TABLE[key] = Lowering(op, backend, rule, key[0])
    return rule


def get_lowering(op: str, backend: Backend, domain: str = "") -> Lowering | None:
    return _TABLE.get(("" if domain in ("ai.onnx", "onnx") else domain, op, backend))


def lowerings(backend: Backend | None = None) -> list[Lowering]:
    """Every registered lowering (for one backend), sorted by op."""
    return sorted((v for v in _TABLE.values() if backend is None or v.backend == backend), key=lambda v: v.op)
