"""Native steps of a bucket plan whose words a move rewrites from the new key's shapes (a `retable`) instead of
binding them again: Expand (a grouped-query decoder's key / value heads repeated for its query heads), and a
Gather whose indices are per-key values (a causal mask's positions read from a fed mask). Each answer must be the
one the key's own plan gives, bit for bit; a Gather's per-key indices are range-checked at every key as its binder
checks them, so a key whose positions fall outside the fed data is refused by name, not read as zeros."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import dynshape as ds
from dynshape.errors import DynshapeError
from dynshape.frontends.onnx import load_onnx
from step_models import attend, step_feed, step_model

D, KV_HEADS, Q_HEADS, VOCAB = 32, 2, 4, 50
HD = D // Q_HEADS


def _gqa_step_model():
    """A Llama-style decoder step: 4 query heads sharing 2 key / value heads (Unsqueeze, Expand, Reshape of the
    growing cache, as transformers exports repeat_kv), and the mask's row for every position gathered from the
    fed mask by a Range over the past's length (a per-key index array), then cast to an additive bias."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    inits = {"wq": (rng.standard_normal((D, D)) * 0.2).astype(np.float32),
             **{f"w{w}": (rng.standard_normal((D, KV_HEADS * HD)) * 0.2).astype(np.float32) for w in "kv"},
             "wo": (rng.standard_normal((D, D)) * 0.2).astype(np.float32),
             "wte": rng.standard_normal((VOCAB, D)).astype(np.float32),
             "two": np.array(2, np.int64), "one": np.array(1, np.int64), "zero": np.array(0, np.int64),
             "qshape": np.array([0, 1, Q_HEADS, HD], np.int64), "kvshape": np.array([0, 1, KV_HEADS, HD], np.int64),
             "rep": np.array([1, 1, Q_HEADS // KV_HEADS, 1, 1], np.int64),
             "heads": np.array([0, Q_HEADS, -1, HD], np.int64), "axis2": np.array([2], np.int64),
             "axes12": np.array([1, 2], np.int64), "out2": np.array([0, 1, D], np.int64),
             "big": np.array(-1e4, np.float32), "onef": np.array(1.0, np.float32)}
    nodes = [n("Gather", ["wte", "ids"], ["x"]),
             n("Shape", ["past_k"], ["pshape"]), n("Gather", ["pshape", "two"], ["past"]),
             n("Add", ["past", "one"], ["past1"]), n("Range", ["zero", "past1", "one"], ["pos"]),
             n("Gather", ["mask", "pos"], ["mrow"], axis=1),
             n("MatMul", ["x", "wq"], ["qp"]), n("Reshape", ["qp", "qshape"], ["qr"]),
             n("Transpose", ["qr"], ["q"], perm=[0, 2, 1, 3])]
    for w in "kv":
        nodes += [n("MatMul", ["x", f"w{w}"], [f"{w}p"]), n("Reshape", [f"{w}p", "kvshape"], [f"{w}r"]),
                  n("Transpose", [f"{w}r"], [f"{w}t"], perm=[0, 2, 1, 3]),
                  n("Concat", [f"past_{w}", f"{w}t"], [f"present_{w}"], axis=2),
                  n("Unsqueeze", [f"present_{w}", "axis2"], [f"{w}5"]),
                  n("Expand", [f"{w}5", "rep"], [f"{w}x"]),
                  n("Reshape", [f"{w}x", "heads"], [f"{w}h"])]
    return step_model(nodes + attend("q", "kh", "vh"), inits, KV_HEADS, HD, "mlen")


GRAPH = load_onnx(_gqa_step_model())


def _feed(rng, batch: int, past: int, mlen: int | None = None) -> dict:
    return step_feed(rng, batch, past, KV_HEADS, HD, VOCAB, mlen)


def _pair() -> tuple:
    return ds.compile(GRAPH, strategy="generic"), ds.compile(GRAPH, strategy="generic", bucket_plans=False)


def test_a_gqa_decode_loop_retables_its_expands_and_mask_gather(monkeypatch):
    """40 tokens: each past length new, every answer the own plans' bit for bit, and the Expands and the mask's
    Gather are bound only when a bucket plan is made (a few times), not at each of the 40 moves
    (before: 2 Expands and the Gather bound again at every token)."""
    fast, own = _pair()
    binds: dict[str, int] = {}
    pl = fast.generic.bucket_planner  # (the planner bucket plans take: runtime/per_key.py)
    real = pl.bind_step

    def counting(s, *a):
        op = getattr(getattr(s, "node", None), "op_type", "kernel")
        binds[op] = binds.get(op, 0) + 1
        return real(s, *a)

    monkeypatch.setattr(pl, "bind_step", counting)
    rng = np.random.default_rng(1)
    feed = _feed(rng, 2, 3)
    for i in range(40):
        a, b = fast.run(feed), own.run(feed)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
        past = feed["past_k"].shape[2]
        feed = {"ids": np.full((2, 1), i % VOCAB), "mask": np.ones((2, past + 2), np.int64),
                "past_k": a["present_k"], "past_v": a["present_v"]}
    (arena,) = [x for x in fast.arenas if x.buckets]
    made = len(arena.buckets)
    assert fast.stats()["plans"]["own"] == 0 and made <= 3
    assert 0 < binds.get("Expand", 0) <= 2 * made and binds.get("Gather", 0) <= 2 * made, (binds, made)
    ref = GRAPH.run(feed)
    for k, v in fast.run(feed).items():
        np.testing.assert_allclose(v, ref[k], rtol=1e-4, atol=1e-4)


def test_a_per_key_gather_out_of_range_is_refused_by_name_at_a_moved_key():
    """A mask shorter than the positions the Range makes: the Gather's per-key indices fall outside it at this
    key; the move's retable checks them as the binder does, so the call is refused naming the node (not answered
    with the zeros the C gather writes for an index it does not read), and the next key is served as before."""
    fast, own = _pair()
    rng = np.random.default_rng(2)
    for past in (20, 21, 22):  # a bucket plan, moved twice
        feed = _feed(rng, 1, past)
        for k, v in own.run(feed).items():
            np.testing.assert_array_equal(fast.run(feed)[k], v)
    bad = _feed(rng, 1, 23, mlen=10)
    for exe in (own, fast):
        with pytest.raises((DynshapeError, IndexError), match="Gather|index"):
            exe.run(bad)
    feed = _feed(rng, 1, 24)
    for k, v in own.run(feed).items():
        np.testing.assert_array_equal(fast.run(feed)[k], v)
