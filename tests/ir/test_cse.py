"""Common-subexpression elimination keeps every value, drops repeated work, and never merges impure nodes."""

from __future__ import annotations

import numpy as np

from dynshape.ir.graph import Node
from dynshape.passes.cse import eliminate_common


def _n(op, ins, outs, **attrs):
    return Node(op, "", outs[0], attrs, list(ins), list(outs))


def test_repeats_are_dropped_and_their_readers_renamed():
    nodes = [_n("Cast", ["x"], ["a"], to=1), _n("Cast", ["x"], ["b"], to=1), _n("Cast", ["x"], ["c"], to=7),
             _n("Add", ["a", "b"], ["s"]), _n("Add", ["a", "a"], ["t"]), _n("Mul", ["s", "t"], ["y"])]
    out = eliminate_common(nodes, {"y"})
    assert [n.outputs[0] for n in out] == ["a", "c", "s", "y"]  # b == a, then t == s (both Add(a, a))
    assert out[-1].inputs == ["s", "s"]


def test_graph_outputs_random_ops_and_array_attributes():
    w1, w2 = np.zeros(3, np.float32), np.ones(3, np.float32)
    nodes = [_n("Cast", ["x"], ["a"], to=1), _n("Cast", ["x"], ["out"], to=1),
             _n("RandomUniformLike", ["x"], ["r1"]), _n("RandomUniformLike", ["x"], ["r2"]),
             _n("Pad", ["x"], ["p1"], value=w1), _n("Pad", ["x"], ["p2"], value=w2), _n("Pad", ["x"], ["p3"], value=w1)]
    names = [n.outputs[0] for n in eliminate_common(nodes, {"out"})]
    assert names == ["a", "out", "r1", "r2", "p1", "p2"]
