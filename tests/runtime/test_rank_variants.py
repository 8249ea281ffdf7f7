"""Ranks fixed by an input's length (a shape / axes tensor fed at run time): one build per length, cached,
explained, capped (runtime/rank_variants.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.runtime.rank_variants import RankVariants


def _reshape_model():
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
                                       helper.make_tensor_value_info("s", TensorProto.INT64, ["k"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def _unsqueeze_model():
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["u"]), helper.make_node("Sigmoid", ["u"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3]),
                                       helper.make_tensor_value_info("axes", TensorProto.INT64, ["k"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def test_one_build_per_length_each_reused():
    g = ds.load_onnx(_reshape_model())
    exe = ds.compile(g)
    assert isinstance(exe, RankVariants)
    x = np.arange(12, dtype=np.float32) - 5
    for shape in ([3, 4], [12], [2, 3, 2], [4, 3], [6, 2], [1, 12], [2, 2, 3]):
        s = np.array(shape, np.int64)
        np.testing.assert_array_equal(exe.run({"x": x, "s": s})["y"], g.run({"x": x, "s": s})["y"])
    built = exe.variants
    assert [dict(k)["k"] for k in built] == [2, 1, 3]  # three lengths, each built once, in first-seen order
    first = built[(("k", 2),)]
    exe.run({"x": x, "s": np.array([2, 6], np.int64)})
    assert exe.variants[(("k", 2),)] is first  # a seen length is never rebuilt
    info = exe.explain_build()
    by_len = {v["values"]["k"]: v for v in info["rank_variants"]}
    assert by_len[2]["calls"] == 5 and by_len[2]["from"]["k"] == "input 's' axis 0"
    assert "Reshape" in by_len[2]["why"]["k"]
    assert "input 's' axis 0" in exe.explain()


def test_axes_fed_at_run_time():
    g = ds.load_onnx(_unsqueeze_model(), dims={"b": (1, 16)})
    exe = ds.compile(g)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    for axes in ([0], [0, 3], [1], [-1, 0, 2]):
        a = np.array(axes, np.int64)
        np.testing.assert_allclose(exe.run({"x": x, "axes": a})["y"], g.run({"x": x, "axes": a})["y"], rtol=1e-6)
    one = exe.variants[(("k", 1),)]
    assert not one.graph.rank_symbols and len(one.graph.types["y"].shape) == 3  # the length fixed the rank


def test_past_the_limit_a_new_length_is_refused_naming_it():
    exe = ds.compile(ds.load_onnx(_reshape_model()), max_rank_variants=2)
    x = np.ones(4, np.float32)
    exe.run({"x": x, "s": np.array([4], np.int64)})
    exe.run({"x": x, "s": np.array([2, 2], np.int64)})
    with pytest.raises(ds.DynshapeError, match=r"k = 3 \(input 's' axis 0\).*max_rank_variants=2.*k = 1, k = 2"):
        exe.run({"x": x, "s": np.array([1, 2, 2], np.int64)})
    exe.run({"x": x, "s": np.array([1, 4], np.int64)})  # seen lengths still run
    assert len(exe.variants) == 2


def test_the_limit_is_a_typed_option():
    with pytest.raises(ds.DynshapeError, match="max_rank_variants"):
        ds.compile(ds.load_onnx(_reshape_model()), max_rank_variants=0)


def test_a_missing_input_and_a_list_input_are_handled_like_the_binder_does():
    exe = ds.compile(ds.load_onnx(_reshape_model()))
    with pytest.raises(ds.ConstraintViolation, match="missing input 's'"):
        exe.run({"x": np.ones(6, np.float32)})
    out = exe.run({"x": [1.0, -2.0, 3.0, -4.0, 5.0, -6.0], "s": [2, 3]})["y"]
    np.testing.assert_array_equal(out, [[1, 0, 3], [0, 5, 0]])
