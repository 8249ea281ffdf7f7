"""If conditions decided by a small input's value compile: one build per value, each If replaced by its taken branch."""

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as H
from onnx import numpy_helper as N

import dynshape as ds
from dynshape.runtime.build import NodeStep

F = TP.FLOAT


def _branch(name, nodes, outs, inits):
    return H.make_graph(nodes, name, [], [H.make_tensor_value_info(o, F, None) for o in outs],
                        [N.from_array(v, k) for k, v in inits.items()])


def vad_model(hidden=64, seed=0):
    """A VAD-style model (Silero's shape): three If on Equal(sr, 16000): the front end (512 samples by one matrix
    at 16 kHz, the first 256 by another at 8 kHz), a scale, the output non-linearity; an LSTM with its state in
    and out between them."""
    rng = np.random.default_rng(seed)

    def w(*s):
        return (rng.standard_normal(s) * 0.1).astype(np.float32)

    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    inits = {"k16": np.array(16000, np.int64), "w16": w(512, hidden), "w8": w(256, hidden),
             "W": w(1, 4 * hidden, hidden), "R": w(1, 4 * hidden, hidden), "B": w(1, 8 * hidden),
             "wo": w(hidden, 1), "ax0": i64(0),
             "scale16": np.array(1.0, np.float32), "scale8": np.array(2.0, np.float32)}
    then1 = _branch("t1", [H.make_node("MatMul", ["x", "w16"], ["f_t"])], ["f_t"], {})
    else1 = _branch("e1", [H.make_node("Slice", ["x", "s0", "s256", "s1"], ["xs"]),
                           H.make_node("MatMul", ["xs", "w8"], ["f_e"])], ["f_e"],
                    {"s0": i64(0), "s256": i64(256), "s1": i64(1)})
    then2 = _branch("t2", [H.make_node("Mul", ["f", "scale16"], ["g_t"])], ["g_t"], {})
    else2 = _branch("e2", [H.make_node("Mul", ["f", "scale8"], ["g_e"])], ["g_e"], {})
    then3 = _branch("t3", [H.make_node("Sigmoid", ["logit"], ["p_t"])], ["p_t"], {})
    else3 = _branch("e3", [H.make_node("Tanh", ["logit"], ["p_e"])], ["p_e"], {})
    nodes = [H.make_node("Equal", ["sr", "k16"], ["is16"]),
             H.make_node("If", ["is16"], ["f"], then_branch=then1, else_branch=else1, name="front"),
             H.make_node("Relu", ["f"], ["fr"]),
             H.make_node("If", ["is16"], ["g"], then_branch=then2, else_branch=else2, name="scale"),
             H.make_node("Add", ["g", "fr"], ["gf"]),
             H.make_node("Unsqueeze", ["gf", "ax0"], ["seq"]),
             H.make_node("LSTM", ["seq", "W", "R", "B", "", "h", "c"], ["", "hn", "cn"], hidden_size=hidden),
             H.make_node("Squeeze", ["hn", "ax0"], ["h2"]),
             H.make_node("MatMul", ["h2", "wo"], ["logit"]),
             H.make_node("If", ["is16"], ["prob"], then_branch=then3, else_branch=else3, name="head")]
    inputs = [H.make_tensor_value_info("x", F, ["batch", 512]), H.make_tensor_value_info("sr", TP.INT64, []),
              H.make_tensor_value_info("h", F, [1, "batch", hidden]),
              H.make_tensor_value_info("c", F, [1, "batch", hidden])]
    outputs = [H.make_tensor_value_info(o, F, None) for o in ("prob", "hn", "cn")]
    g = H.make_graph(nodes, "vad", inputs, outputs, [N.from_array(v, k) for k, v in inits.items()])
    return H.make_model(g, opset_imports=[H.make_opsetid("", 17)])


def _feed(b, sr, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((b, 512)).astype(np.float32), "sr": np.array(sr, np.int64),
            "h": rng.standard_normal((1, b, 64)).astype(np.float32) * 0.1,
            "c": rng.standard_normal((1, b, 64)).astype(np.float32) * 0.1}


def _close(out, ref):
    for k, r in ref.items():
        np.testing.assert_allclose(out[k], r, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(r).max())))


def test_a_vad_style_model_compiles_a_build_per_sample_rate_with_no_if_left():
    g = ds.load_onnx(vad_model())
    exe = ds.compile(g)
    assert type(exe).__name__ == "BranchVariants" and exe.names == ["sr"]
    for b, sr in ((1, 16000), (3, 8000), (16, 16000), (2, 8000)):
        feed = _feed(b, sr, seed=b)
        _close(exe.run(feed), g.run(feed))
    assert len(exe.variants) == 2  # one build per value, reused
    assert exe.stats()["calls"] == {"sr = 16000": 2, "sr = 8000": 2}
    for build in exe.variants.values():
        ops = [s.op for s in build.generic.steps if isinstance(s, NodeStep)]
        assert "If" not in ops and not [s for s in build.generic.build.uncompiled if s.how == "reference"
                                        and s.op not in ("Unsqueeze", "Squeeze")], ops
    assert "sr = 8000" in exe.explain()


def test_branch_values_are_checked_and_capped_by_name():
    g = ds.load_onnx(vad_model())
    exe = ds.compile(g, max_branch_variants=1)
    exe.run(_feed(1, 16000))
    with pytest.raises(ds.DynshapeError, match=r"sr = 8000.*max_branch_variants=1.*sr = 16000"):
        exe.run(_feed(1, 8000))
    bad = _feed(1, 16000)
    bad["sr"] = np.array(16000.0, np.float32)
    with pytest.raises(ds.ConstraintViolation, match="'sr'"):
        exe.run(bad)
    missing = _feed(1, 16000)
    del missing["sr"]
    with pytest.raises(ds.ConstraintViolation, match="missing input 'sr'"):
        exe.run(missing)
    _close(exe.run(_feed(2, 16000)), g.run(_feed(2, 16000)))  # nothing half-done: the next call answers


def test_an_if_on_computed_values_stays_a_single_executable():
    """A condition on a float tensor's values is not a small input's value: no build per value."""
    then_g = H.make_graph([H.make_node("Neg", ["x"], ["a"])], "t", [], [H.make_tensor_value_info("a", F, None)])
    else_g = H.make_graph([H.make_node("Abs", ["x"], ["b"])], "e", [], [H.make_tensor_value_info("b", F, None)])
    nodes = [H.make_node("ReduceSum", ["x"], ["s"], keepdims=0), H.make_node("Greater", ["s", "zero"], ["cond"]),
             H.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    graph = H.make_graph(nodes, "g", [H.make_tensor_value_info("x", F, ["n"])],
                         [H.make_tensor_value_info("y", F, None)], [N.from_array(np.array(0.0, np.float32), "zero")])
    g = ds.load_onnx(H.make_model(graph, opset_imports=[H.make_opsetid("", 17)]))
    exe = ds.compile(g)
    assert type(exe).__name__ == "Executable"
    for x in (np.array([1.0, 2.0], np.float32), np.array([-3.0, 1.0], np.float32)):
        np.testing.assert_array_equal(exe.run({"x": x})["y"], g.run({"x": x})["y"])


def test_an_if_on_a_shape_compiles_a_build_per_truth_value():
    """torch's x.squeeze(1) under dynamic shapes: If(Equal(Shape(x)[1], 1)) with a Squeeze on one side and an
    Identity on the other (Silero VAD has three). The condition is evaluated per call from the input's shape and
    each truth value gets its build, with the If replaced by its branch; the ranks differ and both are right."""
    then_g = H.make_graph([H.make_node("Squeeze", ["x", "ax1"], ["sq"])], "t", [],
                          [H.make_tensor_value_info("sq", F, None)])
    else_g = H.make_graph([H.make_node("Identity", ["x"], ["id"])], "e", [], [H.make_tensor_value_info("id", F, None)])
    nodes = [H.make_node("Shape", ["x"], ["shape"]), H.make_node("Gather", ["shape", "one"], ["d1"]),
             H.make_node("Equal", ["d1", "one"], ["is1"]),
             H.make_node("If", ["is1"], ["s"], then_branch=then_g, else_branch=else_g),
             H.make_node("Relu", ["s"], ["y"])]
    graph = H.make_graph(nodes, "g", [H.make_tensor_value_info("x", F, ["n", "c", 5])],
                         [H.make_tensor_value_info("y", F, None)],
                         [N.from_array(np.array(1, np.int64), "one"), N.from_array(np.array([1], np.int64), "ax1")])
    g = ds.load_onnx(H.make_model(graph, opset_imports=[H.make_opsetid("", 17)]))
    exe = ds.compile(g)
    assert type(exe).__name__ == "BranchVariants" and exe.names == [] and len(exe.conds) == 1
    rng = np.random.default_rng(0)
    for shape in ((2, 1, 5), (2, 3, 5), (4, 1, 5), (1, 7, 5)):
        x = rng.standard_normal(shape).astype(np.float32)
        out, ref = exe.run({"x": x})["y"], g.run({"x": x})["y"]
        assert out.shape == ref.shape and np.array_equal(out, ref)
    assert len(exe.variants) == 2  # one build per truth value, reused
    for build in exe.variants.values():
        assert "If" not in [s.op for s in build.generic.steps if isinstance(s, NodeStep)]
    with pytest.raises(ds.ConstraintViolation, match="input 'x' has rank 1"):
        exe.run({"x": np.zeros(5, np.float32)})
