"""Optimizer steps of ai.onnx.preview.training: Adagrad, Adam, Momentum, each over any number of tensors.

The inputs are R (learning rate), T (update count), then k tensors, their k gradients and their k state
tensors (Adam has two states each); the outputs are the k new tensors followed by the new states. Each
output has its tensor's shape; the rules check that a tensor, its gradient and its states agree. The
arithmetic follows the spec's pseudo code in the tensors' precision.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape.ir.infer import InferCtx
from dynshape.ir.opdef import register
from dynshape.ir.types import TensorType

DOMAIN = "ai.onnx.preview.training"


def _groups(inputs: list, n_states: int) -> tuple[float, int, list[list[np.ndarray]]]:
    r, t = float(np.asarray(inputs[0]).reshape(-1)[0]), int(np.asarray(inputs[1]).reshape(-1)[0])
    rest = inputs[2:]
    k = len(rest) // (2 + n_states)
    return r, t, [rest[j * k:(j + 1) * k] for j in range(2 + n_states)]


def _adagrad_ref(inputs: list, attrs: dict) -> list:
    r, t, (xs, gs, hs) = _groups(inputs, 1)
    rate = r / (1 + t * attrs.get("decay_factor", 0.0))
    eps, nc = attrs.get("epsilon", 1e-6), attrs.get("norm_coefficient", 0.0)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        gr = nc * x + g
        hn = h + gr * gr
        new_x.append((x - rate * gr / (np.sqrt(hn) + eps)).astype(x.dtype))
        new_h.append(hn.astype(h.dtype))
    return new_x + new_h


def _adam_ref(inputs: list, attrs: dict) -> list:
    r, t, (xs, gs, vs, hs) = _groups(inputs, 2)
    a, b = attrs.get("alpha", 0.9), attrs.get("beta", 0.999)
    eps, nc, post = attrs.get("epsilon", 1e-6), attrs.get("norm_coefficient", 0.0), \
        attrs.get("norm_coefficient_post", 0.0)
    rate = r * np.sqrt(1 - b ** t) / (1 - a ** t) if t > 0 else r
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        gr = nc * x + g
        vn = a * v + (1 - a) * gr
        hn = b * h + (1 - b) * gr * gr
        xn = x - rate * vn / (np.sqrt(hn) + eps)
        new_x.append(((1 - post) * xn).astype(x.dtype))
        new_v.append(vn.astype(v.dtype))
        new_h.append(hn.astype(h.dtype))
    return new_x + new_v + new_h


def _momentum_ref(inputs: list, attrs: dict) -> list:
    r, t, (xs, gs, vs) = _groups(inputs, 1)
    a, b, nc = attrs["alpha"], attrs["beta"], attrs["norm_coefficient"]
    beta = b if t > 0 else 1.0
    nesterov = attrs.get("mode", "standard") == "nesterov"
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        gr = nc * x + g
        vn = a * v + beta * gr
        xn = x - r * (gr + a * vn) if nesterov else x - r * vn
        new_x.append(xn.astype(x.dtype))
        new_v.append(vn.astype(v.dtype))
    return new_x + new_v


def _optimizer_rule(n_states: int) -> Any:
    def infer(ctx: InferCtx) -> list[TensorType]:
        rest = ctx.inputs[2:]
        if len(rest) % (2 + n_states):
            ctx.error(f"expected tensors, gradients and {n_states} state(s) each: {len(rest)} inputs after R, T")
        k = len(rest) // (2 + n_states)
        groups = [rest[j * k:(j + 1) * k] for j in range(2 + n_states)]
        outs: list[list[TensorType]] = [[] for _ in range(1 + n_states)]
        for i in range(k):
            x = groups[0][i]
            shape = tuple(x.shape)
            for grp in groups[1:]:
                if grp[i].rank != x.rank:
                    ctx.error(f"tensor {i} has shape {x.shape} but its gradient/state has {grp[i].shape}")
                shape = tuple(ctx.unify(a, b) for a, b in zip(shape, grp[i].shape))
            for j in range(1 + n_states):
                outs[j].append(TensorType(groups[0 if j == 0 else j + 1][i].dtype, shape))
        return [t for grp in outs for t in grp]

    return infer


register("Adagrad", reference=_adagrad_ref, infer=_optimizer_rule(1), domain=DOMAIN)
register("Adam", reference=_adam_ref, infer=_optimizer_rule(2), domain=DOMAIN)
register("Momentum", reference=_momentum_ref, infer=_optimizer_rule(1), domain=DOMAIN)
