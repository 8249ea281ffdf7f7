"""A lean move's inputs and outputs from one generated function of the key (runtime/lean_io.py): the plan it
leaves must be the one the loop it replaces leaves (the same views, byte counts, out= shapes, copies and fresh
outputs), at every key of a decode loop, through moves and recalls, with and without out=."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx
from dynshape.runtime import rekey
from step_models import step_feed, step_model

D, HEADS, VOCAB = 16, 2, 20
HD = D // HEADS


def _lean_step_model():
    """A decoder step whose moves change words only: the new token's keys and values concatenated to the pasts
    (a traced Concat each), a softmax over the fed mask (kernels with key tables); no step bound again per key."""
    rng = np.random.default_rng(0)
    inits = {"wte": rng.standard_normal((VOCAB, D)).astype(np.float32), "shape4": np.array([0, 1, HEADS, HD]),
             "two": np.array(2.0, np.float32)}
    n = helper.make_node
    nodes = [n("Gather", ["wte", "ids"], ["tok"]), n("Reshape", ["tok", "shape4"], ["t4"]),
             n("Transpose", ["t4"], ["kt"], perm=[0, 2, 1, 3]),
             n("Concat", ["past_k", "kt"], ["present_k"], axis=2), n("Concat", ["past_v", "kt"], ["present_v"], axis=2),
             n("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT), n("Mul", ["maskf", "two"], ["m2"]),
             n("Softmax", ["m2"], ["y"], axis=-1)]
    return step_model(nodes, inits, HEADS, HD, "past_plus_1")


GRAPH = load_onnx(_lean_step_model())


def _snapshot(exe) -> tuple:
    """The bucket plan that served the last call, its fields with addresses as offsets in its arena."""
    (arena,) = [a for a in exe.arenas if a.buckets]
    plan = max(arena.buckets.values(), key=lambda p: p.bucket.last_call)
    base = plan.arena.ctypes.data

    def view(v):
        return None if v is None else (v.shape, v.dtype.str, v.ctypes.data - base, v.flags.c_contiguous,
                                       v.flags.writeable)

    st = plan.bucket
    return (st.key, [view(v) for v in plan.inputs], [(n, view(v)) for n, v in plan.outputs],
            sorted((n, s, d.str) for n, (s, d) in plan.want.items()), [(k, view(v)) for k, v in plan.copy_in],
            [(k, d.str, slot - base, size) for k, d, slot, size, _ in plan.in_place],
            [(x, slot - base, size) for x, slot, size, _ in plan.out_place],
            [(n, s, np.dtype(d).str) for n, s, d in plan.fresh], plan.nbytes,
            sorted((n, view(v)) for n, v in st.arrays.items()))


def _loop(exe, rng, starts: list, out: bool) -> list:
    """Decode loops from each (batch, past) start, 30 tokens each; per call (outputs, the plan's snapshot)."""
    got = []
    for batch, past0 in starts:
        feed = step_feed(rng, batch, past0, HEADS, HD, VOCAB)
        bufs = [{k: np.empty((batch, HEADS, past0 + 31, HD), np.float32) for k in ("present_k", "present_v")}
                for _ in range(2)]
        for i in range(30):
            past = feed["past_k"].shape[2]
            o = {k: np.ndarray((batch, HEADS, past + 1, HD), np.float32, buffer=v) for k, v in bufs[i % 2].items()}
            r = exe.run(feed, out=o if out else None)
            got.append(({k: v.copy() for k, v in r.items()}, _snapshot(exe)))
            feed = {"ids": np.full((batch, 1), i % 7), "mask": np.ones((batch, past + 2), np.int64),
                    "past_k": r["present_k"], "past_v": r["present_v"]}
    return got


@pytest.mark.parametrize("out", [False, True])
def test_a_lean_move_leaves_the_plan_the_loop_leaves(monkeypatch, out):
    made: list = []

    def counted(*args):
        fn = make(*args)
        if fn is None:
            return None
        made.append(0)
        k = len(made) - 1

        def io(*a):
            made[k] += 1
            return fn(*a)
        return io

    make = rekey.make_lean_io
    # (the third start goes back over keys the first met: their states are put back, then moved on from)
    starts = [(2, 3), (2, 50), (2, 10)]
    with monkeypatch.context() as m:
        m.setattr(rekey, "make_lean_io", counted)
        lean = _loop(ds.compile(GRAPH, strategy="generic"), np.random.default_rng(5), starts, out)
    assert made and sum(made) >= 60  # the lean moves took the generated function
    with monkeypatch.context() as m:
        m.setattr(rekey, "make_lean_io", lambda *a: None)
        loop = _loop(ds.compile(GRAPH, strategy="generic"), np.random.default_rng(5), starts, out)
    for (ra, sa), (rb, sb) in zip(lean, loop):
        assert sa == sb
        for k in ra:
            np.testing.assert_array_equal(ra[k], rb[k])


def test_a_value_that_is_not_a_view_of_the_arena_leaves_the_move_to_the_loop():
    """An output that is a constant of the model is read from `fixed`; one that is neither a constant nor a
    plain view of the arena (a joined Concat's columns) makes no function."""

    class _Pl:
        class graph:  # noqa: N801 - a stand-in for Planner.graph
            types: dict = {}
        symbol_names = ("n",)
        in_place, out_place = (), ()

    arena = np.zeros(64, np.uint8)
    assert rekey.make_lean_io(_Pl, arena, (("x", None, 0),), 0, frozenset(), frozenset({"n"})) is None
    fn = rekey.make_lean_io(_Pl, arena, (("x", None, 0),), 0, frozenset({"x"}), frozenset({"n"}))
    c = np.ones(3, np.float32)
    inputs, outputs, views, want, copy_in, in_bytes, out_bytes, fresh = fn((4,), {}, {"x": c}, frozenset())
    assert inputs == [] and outputs[0][1] is c and want == {"x": ((3,), c.dtype)} and views == {} and not fresh
