"""Scaled dot-product attention, lowered whole.

torch's decomposition of `_scaled_dot_product_flash_attention_for_cpu` (what `F.scaled_dot_product_attention`
becomes on CPU) goes through `_scaled_dot_product_attention_math`: tracing it costs aot_autograd about a tenth of
a second per attention layer (0.45 s of the bench BERT's 1.2 s trace), and its result is converted back into
the same five ops emitted here. The frontend keeps the op (see `KEEP`) and emits
MatMul(Q, K^T) -> scale -> + mask -> safe Softmax -> MatMul(P, V), the chain dynshape's attention fusion runs
without materialising the scores. Semantics follow the math path: a boolean mask keeps where True, a float mask
is added, `is_causal` keeps key j for query i when j <= i (top-left aligned), fully masked rows give 0 (see
`safe_softmax`), grouped-query attention repeats each key / value head over its group of query heads.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dynshape.frontends.aten.common import cast, reshape, tensor_of, uses_output
from dynshape.frontends.aten.convert import handles
from dynshape.frontends.aten.emit import Tensor
from dynshape.frontends.aten.ops_math import safe_softmax
from dynshape.frontends.aten.symbols import Unsupported


@handles("_scaled_dot_product_flash_attention_for_cpu.default")
def _sdpa_flash_cpu(cv: Any, node: Any, q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0,
                    is_causal: bool = False, *, attn_mask: Any = None, scale: Any = None) -> tuple:
    if uses_output(node, 1):
        raise Unsupported("the logsumexp output of scaled_dot_product_attention")
    return attention(cv, node, q, k, v, dropout_p, is_causal, attn_mask, scale), None


def attention(cv: Any, node: Any, q: Tensor, k: Tensor, v: Tensor, dropout_p: float, is_causal: bool,
              attn_mask: Any, scale: Any) -> Tensor:
    if dropout_p != 0:
        raise Unsupported(f"scaled_dot_product_attention with dropout_p = {dropout_p} (inference only)")
    if is_causal and attn_mask is not None:
        raise Unsupported("scaled_dot_product_attention with both attn_mask and is_causal")
    em = cv.em
    dt = cv.out_dtype(index=0)
    qs, ks = cv.shape_of(q), cv.shape_of(k)
    if len(qs) < 2 or len(ks) != len(qs) or len(cv.shape_of(v)) != len(qs):
        raise Unsupported("scaled_dot_product_attention over operands of different ranks")
    e = qs[-1]
    if scale is None:
        if not isinstance(e, int):
            raise Unsupported("scaled_dot_product_attention with a symbolic head size and no scale")
        scale = 1.0 / math.sqrt(e)
    if not isinstance(scale, (int, float)):
        raise Unsupported(f"scaled_dot_product_attention with scale {scale!r}")
    k, v = _repeat_heads(cv, q, k), _repeat_heads(cv, q, v)
    r = len(qs)
    lq, s = qs[-2], cv.shape_of(k)[-2]
    scores_dims = (*qs[:-1], s)
    mask = _causal_mask(cv, lq, s, dt) if is_causal else attn_mask
    if mask is not None:  # first, so that the scores' chain is one run of nodes for the fusion
        if cv.dtype_of(mask) == np.bool_:
            mask = em.node("Where", [mask, em.const(np.array(0, dt)), em.const(np.array(-np.inf, dt))],
                           shape=cv.shape_of(mask), dtype=dt)
        mask = cast(cv, mask, dt)
    kt = em.node("Transpose", [k], {"perm": [*range(r - 2), r - 1, r - 2]},
                 shape=(*cv.shape_of(k)[:-2], e, s), dtype=dt)
    x = em.node("MatMul", [q, kt], shape=scores_dims, dtype=dt, hint=f"{node.name}_scores")
    x = em.node("Mul", [x, em.const(np.array(scale, dt))], shape=scores_dims, dtype=dt)
    if mask is not None:
        x = em.node("Add", [x, mask], shape=scores_dims, dtype=dt)
    p = safe_softmax(cv, x, r - 1, scores_dims, dt, f"{node.name}_probs")
    return em.node("MatMul", [p, v], hint=node.name, shape=(*qs[:-1], cv.shape_of(v)[-1]), dtype=dt)


def _repeat_heads(cv: Any, q: Tensor, kv: Tensor) -> Tensor:
    """kv (..., Hk, S, E) with each head repeated over its group of Hq / Hk query heads (torch's enable_gqa)."""
    qs, ks = cv.shape_of(q), cv.shape_of(kv)
    if len(qs) < 3 or qs[-3] == ks[-3]:
        return kv
    hq, hk = qs[-3], ks[-3]
    if not (isinstance(hq, int) and isinstance(hk, int) and hk > 0 and hq % hk == 0):
        raise Unsupported(f"scaled_dot_product_attention with {hq} query heads over {hk} key / value heads")
    em, g = cv.em, hq // hk
    lead = ks[:-3]
    up = em.node("Unsqueeze", [kv, em.ints([len(ks) - 2])], shape=(*lead, hk, 1, *ks[-2:]), dtype=cv.dtype_of(kv))
    wide = (*lead, hk, g, *ks[-2:])
    big = em.node("Expand", [up, em.shape_tensor(wide)], shape=wide, dtype=cv.dtype_of(kv))
    return reshape(cv, big, (*lead, hq, *ks[-2:]))


def _causal_mask(cv: Any, lq: Any, s: Any, dt: Any) -> Tensor:
    """(L, S): 0 where key j <= query i, -inf elsewhere."""
    em = cv.em

    def positions(n: Any) -> Tensor:
        return em.node("Range", [tensor_of(cv, 0, np.int64), tensor_of(cv, n, np.int64), tensor_of(cv, 1, np.int64)],
                       shape=(n,), dtype=np.int64)

    rows = em.node("Unsqueeze", [positions(lq), em.ints([1])], shape=(lq, 1), dtype=np.int64)
    keep = em.node("LessOrEqual", [positions(s), rows], shape=(lq, s), dtype=np.bool_)
    return em.node("Where", [keep, em.const(np.array(0, dt)), em.const(np.array(-np.inf, dt))], shape=(lq, s),
                   dtype=dt)
