"""Every elementwise op with an expression rule, compiled, against its numpy reference: ordinary values over a
wide range plus the special ones (signed zeros, infinities, NaN, the activations' break points)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds

F = TensorProto.FLOAT
X = np.concatenate([np.random.default_rng(0).standard_normal(1000) * 5,
                    [0.0, -0.0, np.inf, -np.inf, np.nan, 3, -3, 6, -6, 1e-30, -1e-30, 88, -88, 100, -100]])
X = X.astype(np.float32)
CASES = [("Relu", {}, []), ("Sigmoid", {}, []), ("Tanh", {}, []), ("Erf", {}, []), ("Exp", {}, []),
         ("Abs", {}, []), ("Neg", {}, []), ("Softplus", {}, []), ("HardSigmoid", {}, []),
         ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, []), ("HardSwish", {}, []), ("LeakyRelu", {"alpha": 0.1}, []),
         ("Clip", {}, ["lo", "hi"]), ("Clip", {}, ["lo"]), ("Sum", {}, ["x2"]), ("Sum", {}, ["x2", "x2"]),
         ("Max", {}, ["x2"]), ("Min", {}, ["x2"]), ("Mish", {}, []), ("Gelu", {}, []),
         ("Gelu", {"approximate": "tanh"}, []), ("PRelu", {}, ["slope"]), ("Add", {}, ["x2"]), ("Div", {}, ["x2"]),
         ("Log", {}, [])]


@pytest.mark.parametrize("op,attrs,extra", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_compiled_elementwise_matches_the_reference(op, attrs, extra):
    inits = {"lo": np.array(0.5, np.float32), "hi": np.array(2.0, np.float32),
             "slope": np.full(X.shape, 0.25, np.float32)}
    inputs = [helper.make_tensor_value_info("x", F, ["n"])]
    if "x2" in extra:
        inputs.append(helper.make_tensor_value_info("x2", F, ["n"]))
    node = helper.make_node(op, ["x", *extra], ["y"], **attrs)
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items() if k in extra])
    graph = ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), dims={"n": X.size})
    exe = ds.compile(graph)
    assert not exe.explain_build()["uncompiled"], exe.explain_build()["uncompiled"]
    feed = {"x": X, **({"x2": X[::-1].copy()} if "x2" in extra else {})}
    got, want = exe.run(feed)["y"], graph.run(feed)["y"]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, equal_nan=True)
    assert np.array_equal(np.isnan(got), np.isnan(want))


@pytest.mark.parametrize("floor", [-3.0, float("nan")])
def test_log_and_a_clip_bounded_at_run_time_compile(floor):
    """A log spectrogram floored at its maximum minus a margin (openWakeWord's melspectrogram.onnx): the Log and
    the Clip whose lower bound is computed per call run in kernels, NaN bounds and operands as numpy's clip."""
    nodes = [helper.make_node("Log", ["x"], ["l"]),
             helper.make_node("ReduceMax", ["l"], ["m"], keepdims=0),
             helper.make_node("Add", ["m", "margin"], ["lo"]),
             helper.make_node("Clip", ["l", "lo", "hi"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["b", "n"])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(np.array(floor, np.float32), "margin"),
                           numpy_helper.from_array(np.array(np.inf, np.float32), "hi")])
    graph = ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    exe = ds.compile(graph)
    ran = {u["op"]: u["runs"] for u in exe.explain_build()["uncompiled"]}
    assert "Log" not in ran and "Clip" not in ran, ran
    for x in (np.abs(X[:1000]).reshape(4, 250) + 1e-3, X[:1000].reshape(2, 500)):  # then zeros, negatives, NaN
        got, want = exe.run({"x": x})["y"], graph.run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, equal_nan=True)
        assert np.array_equal(np.isnan(got), np.isnan(want))
