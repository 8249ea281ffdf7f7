"""A global pool (ReduceMean / ReduceMax over the middle axis of a rank-3 tensor, read as channels-last) whose
channel count is symbolic: a layer norm's statistics over 120 features of an (N, L, 120) sequence the layout pass
turned into (N, 120, L) (ppocr_rec). Compiled, never the reference, at several lengths against the reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.ir.opdef import lookup


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax"])
def test_a_global_pool_over_symbolic_channels_is_a_kernel(op):
    f = TensorProto.FLOAT
    node = helper.make_node(op, ["x"], ["y"], axes=[1], keepdims=1)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", f, ["n", 120, "l"])],
                          [helper.make_tensor_value_info("y", f, None)])
    exe = ds.compile(ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])))
    assert not exe.explain_build()["uncompiled"], exe.explain_build()["uncompiled"]
    rng = np.random.default_rng(7)
    for shape in [(1, 120, 36), (2, 120, 1), (3, 120, 200), (1, 120, 0)]:  # 200: more than one channel block
        x = (rng.standard_normal(shape) * 4 + 1).astype(np.float32)
        got = exe.run({"x": x})["y"]
        want = lookup(op).reference([x], {"axes": [1], "keepdims": 1})[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * max(1.0, float(np.abs(x).max(initial=0))))
