"""Helpers the ATen op handlers share: dtypes, scalars as tensors, casts, reshapes that fold away."""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.frontends.aten.emit import Tensor
from dynshape.frontends.aten.symbols import Unsupported
from dynshape.sym import is_expr

INT64_MAX = (1 << 63) - 1


def cast(cv: Any, t: Tensor, dtype: Any) -> Tensor:
    """`t` as `dtype` (no node when it already is); constants are converted here."""
    dtype = np.dtype(dtype)
    if cv.dtype_of(t) == dtype:
        return t
    c = cv.em.const_value(t)
    if c is not None and c.size <= 1 << 16:
        return cv.em.const(c.astype(dtype), key=("cast", cv.em.key[t.name], dtype.str))
    return cv.em.node("Cast", [t], {"to": onnx_type(dtype)}, shape=cv.shape_of(t), dtype=dtype)


def onnx_type(dtype: Any) -> int:
    """The ONNX TensorProto code of a numpy dtype (Cast's `to`)."""
    from onnx import helper

    try:
        return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except Exception:
        raise Unsupported(f"dtype {dtype} has no ONNX code") from None


def tensor_of(cv: Any, x: Any, dtype: Any) -> Tensor:
    """A Tensor for an op operand: a Tensor (cast to dtype), a Python number or a size (0-d of dtype)."""
    dtype = np.dtype(dtype)
    if isinstance(x, Tensor):
        return cast(cv, x, dtype)
    if is_expr(x):
        t = cv.em.node("Squeeze", [cv.em.dim(x), cv.em.ints([0])], shape=(), dtype=np.int64)
        return cast(cv, t, dtype)
    if isinstance(x, (bool, int, float, np.number)):
        return cv.em.const(np.array(x, dtype=dtype))
    raise Unsupported(f"operand {x!r} ({type(x).__name__}) is not a tensor or a number")


def fake_of(cv: Any, a: Any) -> Any:
    """The FakeTensor (or Python scalar) an FX argument stands for, for torch's type promotion."""
    if type(a).__name__ == "Node":
        return cv.meta(a)
    return a


def promoted(cv: Any, node: Any, n: int = 2) -> np.dtype:
    """torch's result dtype of the node's first `n` operands (comparisons compute in it)."""
    import torch

    args = []
    for a in node.args[:n]:
        v = fake_of(cv, a)
        if type(v).__name__ in ("SymInt",):
            v = 1
        elif type(v).__name__ == "SymFloat":
            v = 1.0
        args.append(v)
    if len(args) == 1:
        return np_of(args[0].dtype)
    try:
        return np_of(torch.result_type(args[0], args[1]))
    except Exception as e:
        raise Unsupported(f"cannot promote operand types ({e})") from None


def np_of(dt: Any) -> np.dtype:
    from dynshape.frontends.aten.convert import np_dtype

    return np_dtype(dt)


def axis(d: int, rank: int) -> int:
    """A torch dim as a non-negative axis (0-d tensors accept dim 0 / -1)."""
    d = int(d)
    if rank == 0:
        return 0
    return d + rank if d < 0 else d


def reshape(cv: Any, x: Tensor, target: tuple, hint: str | None = None) -> Tensor:
    """`x` viewed as `target` dims. A chain of views collapses onto its first source, and a view back to a shape
    the chain started from is no node at all, so view / bmm / view sequences leave no copies behind."""
    em = cv.em
    src = em.reshape_src.get(x.name, x.name)
    target = tuple(target)
    if em.shape.get(src) == target:
        return Tensor(src)
    src_dims = em.shape[src]
    if any(isinstance(d, int) and d == 0 for d in target):
        out = em.node("Reshape", [Tensor(src), em.shape_tensor(target)], {"allowzero": 1}, hint=hint,
                      shape=target, dtype=em.dtype[src])
    else:
        enc: list[Any] = []
        free = []
        for i, d in enumerate(target):
            if isinstance(d, int):
                enc.append(d)
            elif i < len(src_dims) and src_dims[i] == d:
                enc.append(0)
            else:
                enc.append(d)
                free.append(i)
        if free:
            enc[free[0]] = -1
        out = em.node("Reshape", [Tensor(src), em.shape_tensor(tuple(enc))], hint=hint, shape=target,
                      dtype=em.dtype[src])
    em.reshape_src[out.name] = src
    return out


def root(cv: Any, x: Tensor) -> Tensor:
    """The value a chain of reshapes started from (x itself when it is not a reshape)."""
    return Tensor(cv.em.reshape_src.get(x.name, x.name))


def const_1d(cv: Any, values: list) -> Tensor:
    """A 1-D int64 tensor of ints and sizes (a shape tensor when any is symbolic)."""
    return cv.em.shape_tensor(tuple(values))


def static_int(x: Any, what: str) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise Unsupported(f"{what} must be a fixed integer, got {x}")
    return int(x)


def uses_output(node: Any, index: int) -> bool:
    """Whether any reader of a multi-output node takes output `index` (getitem users)."""
    import operator

    for u in node.users:
        if u.target is operator.getitem and u.args[1] == index:
            return True
    return False
