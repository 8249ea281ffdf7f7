"""F.scaled_dot_product_attention lowered whole (frontends/aten/ops_attention.py), against eager torch, with
symbolic sequence lengths, and run by dynshape's fused attention kernel."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch.export import Dim  # noqa: E402

import dynshape as ds  # noqa: E402
from tolerance import assert_f32_close  # noqa: E402


class Sdpa(torch.nn.Module):
    def __init__(self, mode: str, scale: float | None = None) -> None:
        super().__init__()
        self.mode, self.scale = mode, scale

    def forward(self, q, k, v, lens):
        s = k.shape[2]
        mask = None
        if self.mode in ("bool", "float"):  # key j is visible when j < lens[b]
            keep = torch.arange(s)[None, None, None, :] < lens[:, None, None, None]
            mask = keep if self.mode == "bool" else torch.where(keep, 0.0, -1e9)
        gqa = q.shape[1] != k.shape[1]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.mode == "causal",
                                              scale=self.scale, enable_gqa=gqa)


CASES = [("float", None, 4), ("bool", 0.3, 4), ("causal", None, 4), ("none", None, 2)]


@pytest.mark.parametrize("mode,scale,kv_heads", CASES)
def test_sdpa_matches_eager_over_lengths(mode, scale, kv_heads):
    m = Sdpa(mode, scale).eval()
    b, lq, lk = Dim("b", min=1, max=4), Dim("lq", min=1, max=64), Dim("lk", min=1, max=64)
    if mode == "causal":
        lk = lq
    ex = (torch.randn(2, 4, 7, 16), torch.randn(2, kv_heads, 7, 16), torch.randn(2, kv_heads, 7, 16),
          torch.tensor([7, 3]))
    shapes = ({0: b, 2: lq}, {0: b, 2: lk}, {0: b, 2: lk}, {0: b})
    g = ds.from_torch(m, ex, dynamic_shapes=shapes)
    assert not any(n.op_type == "Mul" and "sqrt" in n.name.lower() for n in g.nodes)
    exe = ds.compile(g)
    steps = [(s.kind, sorted({n.op_type for n in s.nodes})) for s in exe.generic.steps if hasattr(s, "kind")]
    fused = [ops for kind, ops in steps if {"MatMul", "Softmax"} <= set(ops)]
    assert len(fused) == 1 and not any("Softmax" in ops for kind, ops in steps if ops not in fused), steps
    rng = np.random.default_rng(0)
    for bb, q_len, k_len in [(1, 1, 1), (3, 5, 12), (2, 33, 33), (4, 64, 40)]:
        k_len = q_len if mode == "causal" else k_len
        q = torch.from_numpy(rng.standard_normal((bb, 4, q_len, 16)).astype(np.float32))
        k = torch.from_numpy(rng.standard_normal((bb, kv_heads, k_len, 16)).astype(np.float32))
        v = torch.from_numpy(rng.standard_normal((bb, kv_heads, k_len, 16)).astype(np.float32))
        lens = torch.from_numpy(rng.integers(1, k_len + 1, bb))
        with torch.no_grad():
            ref = m(q, k, v, lens).numpy()
        feed = dict(zip([x.name for x in g.inputs], [t.numpy() for t in (q, k, v, lens)]))
        out = exe.run(feed)
        assert_f32_close(next(iter(out.values())), ref, rtol=1e-4, scale=1e-5)
