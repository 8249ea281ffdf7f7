"""What the compiler knows about one tensor: dtype, symbolic shape, and (for shape arithmetic) its contents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Dim = Any  # int | dynshape.sym.Expr
Shape = tuple  # tuple[Dim, ...]


@dataclass(frozen=True)
class TensorType:
    """dtype + shape (+ known value).

    `value`, when not None, is the tensor's content known at compile time: a numeric numpy array (a constant),
    or an object array of `int | Expr` (a symbolic shape value, e.g. the output of `Shape`). Shape-arithmetic
    rules propagate it so Reshape/Expand/ConstantOfShape/Range see exact symbolic sizes, never "unknown".
    """

    dtype: np.dtype
    shape: Shape
    value: np.ndarray | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class SequenceType:
    """An ONNX `seq(tensor)`: elements share `dtype`; `shape` is their common shape when known, else None;
    `rank` is the elements' common rank when known (their dims may differ from element to element).

    Only the control-flow and sequence ops produce these; tensor shape rules never see them. An element taken
    out of a sequence of unknown shape but known rank gets fresh dims (`SequenceAt`, `SequenceMap` bodies).
    """

    dtype: np.dtype
    shape: Shape | None = None
    rank: int | None = None

    def __post_init__(self) -> None:
        if self.shape is not None:
            object.__setattr__(self, "rank", len(self.shape))


@dataclass(frozen=True)
class OptionalType:
    """An ONNX `optional(T)`: a value of type `elem`, or nothing (None at run time)."""

    elem: TensorType | SequenceType


ValueType = Any  # TensorType | SequenceType | OptionalType
