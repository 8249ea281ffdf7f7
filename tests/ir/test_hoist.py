"""Scalar ops move above data movement only where that is exact, and the compiled results stay bitwise equal."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx
from dynshape.passes.hoist import hoist_scalar_ops

F = TensorProto.FLOAT


def _heads(op: str, scalar_first: bool, c_shape: list, second_reader: bool = False):
    """x (b, s, 12) -> Reshape (b, s, 3, 4) -> Transpose (0, 2, 1, 3) -> op with a scalar constant."""
    pair = ["c", "t"] if scalar_first else ["t", "c"]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node(op, pair, ["y"])]
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if second_reader:  # the transposed value is read elsewhere too: moving the op would need a second copy
        nodes.append(helper.make_node("Neg", ["t"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", F, None))
    inits = [helper.make_tensor("shape", TensorProto.INT64, [4], [0, 0, 3, 4]),
             helper.make_tensor("c", F, c_shape, [0.3535533845424652])]
    graph = helper.make_graph(nodes, "heads", [helper.make_tensor_value_info("x", F, ["b", "s", 12])], outputs, inits)
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                     dims={"b": (1, 4), "s": (1, 50)})


def _hoisted(g) -> list[str]:
    nodes, _ = hoist_scalar_ops(list(g.nodes), g.types, g.constants(), {v.name for v in g.outputs})
    return [n.op_type for n in nodes]


@pytest.mark.parametrize("op", ["Mul", "Div", "Add", "Sub"])
@pytest.mark.parametrize("scalar_first", [False, True])
def test_scalar_op_moves_above_the_movement_and_values_stay_bitwise(op, scalar_first):
    g = _heads(op, scalar_first, [])
    assert _hoisted(g) == [op, "Reshape", "Transpose"]
    exe = ds.compile(g)
    rng = np.random.default_rng(3)
    for b, s in [(1, 1), (3, 17), (4, 50)]:
        x = rng.standard_normal((b, s, 12)).astype(np.float32)
        x.flat[0] = np.nan
        got, want = exe.run({"x": x})["y"], g.run({"x": x})["y"]
        assert got.shape == want.shape == (b, 3, s, 4)
        if op == "Div" and not scalar_first:  # codegen divides by a constant as a multiply by its reciprocal
            np.testing.assert_array_max_ulp(got, want, maxulp=1)
        else:
            np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_not_moved_when_the_movement_has_another_reader_or_the_scalar_would_add_a_rank():
    assert _hoisted(_heads("Mul", False, [], second_reader=True)) == ["Reshape", "Transpose", "Mul", "Neg"]
    # a (1, 1, 1, 1) constant broadcast against the rank-3 source would make it rank 4
    assert _hoisted(_heads("Mul", False, [1, 1, 1, 1])) == ["Reshape", "Transpose", "Mul"]
    g = _heads("Mul", False, [1, 1, 1, 1])
    x = np.random.default_rng(0).standard_normal((2, 5, 12)).astype(np.float32)
    np.testing.assert_array_equal(ds.compile(g).run({"x": x})["y"], g.run({"x": x})["y"])
