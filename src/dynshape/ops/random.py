"""Random ops: RandomNormal, RandomUniform (and their *Like forms), Bernoulli, Multinomial.

A node with a `seed` is deterministic: it draws from numpy's MT19937 stream seeded with int(seed), in C order,
one draw per element (the generator ONNX's own test data is made with, so seeded Dropout masks reproduce
it). A node without one draws fresh values on every call. Inference never constant-folds these ops
(`ir.infer.NO_FOLD`), so a seeded node still runs when the graph does rather than once at load time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType
from dynshape.ops import dtypes as dt


def generator(attrs: dict) -> np.random.RandomState | np.random.Generator:
    """The node's random stream: seeded and reproducible when `seed` is set, fresh otherwise."""
    seed = attrs.get("seed")
    if seed is None:
        return np.random.default_rng()
    return np.random.RandomState(int(seed) & 0xFFFFFFFF)


def _uniform(rng: Any, low: float, high: float, shape: tuple) -> np.ndarray:
    return rng.uniform(low, high, size=shape) if shape else np.asarray(rng.uniform(low, high))


def _normal(rng: Any, mean: float, scale: float, shape: tuple) -> np.ndarray:
    return rng.normal(mean, scale, size=shape) if shape else np.asarray(rng.normal(mean, scale))


def _out_dtype(attrs: dict, like: np.ndarray | None) -> np.dtype:
    code = attrs.get("dtype")
    if code is not None:
        return dt.np_dtype(code)
    return like.dtype if like is not None else np.dtype(np.float32)


def _random_ref(kind: str, like: bool) -> Any:
    def ref(inputs: list, attrs: dict) -> list:
        src = inputs[0] if like else None
        shape = tuple(src.shape) if like else tuple(int(d) for d in attrs.get("shape", []))
        rng = generator(attrs)
        if kind == "normal":
            v = _normal(rng, attrs.get("mean", 0.0), attrs.get("scale", 1.0), shape)
        else:
            v = _uniform(rng, attrs.get("low", 0.0), attrs.get("high", 1.0), shape)
        return [dt.cast(np.asarray(v), _out_dtype(attrs, src))]

    return ref


def _random_rule(like: bool) -> Any:
    def infer(ctx: InferCtx) -> list[TensorType]:
        if like:
            x = ctx.inputs[0]
            code = ctx.attr("dtype")
            return [TensorType(dt.np_dtype(code) if code is not None else x.dtype, x.shape)]
        shape = ctx.attr("shape")
        if shape is None:
            ctx.error("the 'shape' attribute is required")
        if any(int(d) < 0 for d in shape):
            ctx.error(f"shape {shape} has a negative dim")
        return [TensorType(dt.np_dtype(ctx.attr("dtype", 1)), tuple(int(d) for d in shape))]

    return infer


register("RandomNormal", reference=_random_ref("normal", False), infer=_random_rule(False), random=True)
register("RandomUniform", reference=_random_ref("uniform", False), infer=_random_rule(False), random=True)
register("RandomNormalLike", reference=_random_ref("normal", True), infer=_random_rule(True), random=True)
register("RandomUniformLike", reference=_random_ref("uniform", True), infer=_random_rule(True), random=True)


def _bernoulli_ref(inputs: list, attrs: dict) -> list:
    """1 where a uniform draw in [0, 1) falls below the element's probability."""
    p = inputs[0]
    u = _uniform(generator(attrs), 0.0, 1.0, p.shape)
    return [dt.cast((u < p.astype(np.float64)).astype(np.float64), _out_dtype(attrs, p))]


register("Bernoulli", reference=_bernoulli_ref, infer=_random_rule(True), random=True)


def _multinomial_ref(inputs: list, attrs: dict) -> list:
    """sample_size draws per row from softmax(row) (the rows are unnormalised log-probabilities)."""
    x = inputs[0].astype(np.float64)
    n = int(attrs.get("sample_size", 1))
    p = np.exp(x - x.max(axis=1, keepdims=True, initial=-np.inf)) if x.shape[1] else x
    cdf = np.cumsum(p, axis=1)
    u = _uniform(generator(attrs), 0.0, 1.0, (x.shape[0], n)) * cdf[:, -1:] if x.shape[1] else np.zeros((0, n))
    idx = np.stack([np.searchsorted(cdf[b], u[b], side="right") for b in range(x.shape[0])]) if x.shape[0] else \
        np.zeros((0, n), np.int64)
    return [np.minimum(idx, max(x.shape[1] - 1, 0)).astype(dt.np_dtype(attrs.get("dtype", 6)))]


def _multinomial_rule(ctx: InferCtx) -> list[TensorType]:
    x = ctx.inputs[0]
    if x.rank != 2:
        ctx.error(f"the input must be (batch_size, class_size), got {x.shape}")
    code = ctx.attr("dtype", 6)
    if dt.np_dtype(code) not in (np.dtype(np.int32), np.dtype(np.int64)):
        ctx.error(f"dtype must be int32 or int64, got {dt.np_dtype(code)}")
    return [TensorType(dt.np_dtype(code), (x.shape[0], int(ctx.attr("sample_size", 1))))]


register("Multinomial", reference=_multinomial_ref, infer=_multinomial_rule, random=True)
