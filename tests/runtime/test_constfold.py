"""Constant subgraphs are computed once at compile time, whatever their size, and capped by bytes."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.errors import ModelError
from dynshape.runtime.build import NodeStep

F = TensorProto.FLOAT
RNG = np.random.default_rng(3)


def _model(nodes, inits):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["n", 512])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return ds.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _node_ops(exe) -> list[str]:
    return [s.op for s in exe.generic.steps if isinstance(s, NodeStep)]


def test_weights_made_by_nodes_are_folded_at_compile_time():
    """A 512 x 512 weight (262,144 elements, past inference's own folding limit) made from float16 by a Cast, then
    transposed, and a bias made by ConstantOfShape: none of them runs per call, and the answer is the reference's."""
    w16 = (RNG.standard_normal((512, 512)) * 0.05).astype(np.float16)
    nodes = [helper.make_node("Cast", ["w16"], ["w32"], to=F),
             helper.make_node("Transpose", ["w32"], ["wt"], perm=[1, 0]),
             helper.make_node("ConstantOfShape", ["bshape"], ["b"],
                              value=helper.make_tensor("v", F, [1], [0.25])),
             helper.make_node("MatMul", ["x", "wt"], ["p"]),
             helper.make_node("Add", ["p", "b"], ["y"])]
    g = _model(nodes, {"w16": w16, "bshape": np.array([512], np.int64)})
    exe = ds.compile(g)
    assert not {"Cast", "Transpose", "ConstantOfShape"} & set(_node_ops(exe)), _node_ops(exe)
    assert exe.folded.nbytes >= 2 * 512 * 512 * 4 and exe.folded.by_op["Cast"] == 1
    for n in (1, 5):
        x = RNG.standard_normal((n, 512)).astype(np.float32)
        ref = x @ w16.astype(np.float32).T + 0.25
        out = exe.run({"x": x})["y"]
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_folding_past_its_byte_cap_is_refused_naming_the_node_the_bytes_and_the_option():
    nodes = [helper.make_node("ConstantOfShape", ["wshape"], ["w"], value=helper.make_tensor("v", F, [1], [0.5])),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    g = _model(nodes, {"wshape": np.array([512, 300], np.int64)})
    with pytest.raises(ModelError, match=r"ConstantOfShape.*614,400 bytes.*fold_bytes=100,000"):
        ds.compile(g, fold_bytes=100_000)
    exe = ds.compile(g)  # under the default cap it folds
    assert "ConstantOfShape" not in _node_ops(exe)
    x = RNG.standard_normal((2, 512)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-5, atol=1e-5 * 256)


def test_folding_leaves_outputs_random_ops_and_inputs_alone():
    """A graph output made from constants stays a step (the executable returns what its steps compute); a random
    op is never folded; nodes reading an input are not constants."""
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["y"], value=helper.make_tensor("v", F, [1], [1.0])),
             helper.make_node("RandomNormal", [], ["r"], shape=[4]),
             helper.make_node("Relu", ["x"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["n"])],
                              [helper.make_tensor_value_info(o, F, None) for o in ("y", "r", "z")],
                              [numpy_helper.from_array(np.array([3], np.int64), "s")])
    g = ds.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    from dynshape.passes.constfold import fold_constant_nodes

    folded = fold_constant_nodes(g, 1 << 30)
    assert folded.nbytes == 0 and folded.graph is g
