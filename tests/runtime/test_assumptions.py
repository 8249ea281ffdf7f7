"""Inputs that break an assumption of the generic build (a symbolic Reshape entry that is 0) are valid: they run
a build at their exact shape, as the reference does (runtime/assumptions.py)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import dynshape as ds


def _graph():
    nodes = [helper.make_node("Shape", ["y"], ["n"]),
             helper.make_node("Concat", ["n", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape"),
             helper.make_node("Relu", ["r"], ["out"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"]),
                                       helper.make_tensor_value_info("y", TensorProto.FLOAT, ["k"])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                          [helper.make_tensor("minus1", TensorProto.INT64, [1], [-1])])
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))


def test_a_zero_reshape_entry_runs_an_exact_build_like_the_reference():
    graph = _graph()
    assert any(f.kind == "assume" for f in graph.signature.facts)
    exe = ds.compile(graph)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    for k in (3, 0, 2, 0):  # k = 0: the entry copies x's first dim (ONNX's 0), so the result keeps shape (2, 3)
        feed = {"x": x, "y": np.zeros(k, np.float32)}
        want = graph.run(feed)["out"]
        got = exe.run(feed)["out"]
        assert got.shape == want.shape and np.array_equal(got, want), (k, got.shape, want.shape)
    assert exe.run({"x": x, "y": np.zeros(0, np.float32)})["out"].shape == (2, 3)
    # k = 0 is also a key with a 0 (k may be 0): the empty-tensor build takes it, and there the broken
    # assumption routes it to the exact build, made once and reused
    empty = exe.empty_build()
    builds = empty._assumed.builds
    assert len(builds) == 1 and dict(zip(empty._names, next(iter(builds))))["k"] == 0  # built once, reused
    assert any("served by a build at exactly this shape" in n for n in empty.notes)
    assert exe._assumed.builds == {}
    single = ds.compile(_graph(), nonempty_build=False)  # one build for every key: the assumption routes k = 0
    assert single.run({"x": x, "y": np.zeros(0, np.float32)})["out"].shape == (2, 3)
    assert len(single._assumed.builds) == 1


def test_keys_within_the_assumption_never_build_another():
    exe = ds.compile(_graph())
    x = np.ones((4, 6), np.float32)
    for k in (1, 2, 3, 4, 6, 8):
        exe.run({"x": x, "y": np.zeros(k, np.float32)})
    assert exe._assumed.builds == {}
