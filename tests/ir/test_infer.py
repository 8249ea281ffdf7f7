"""Shape inference: facts with provenance, contradictions with node + fix, folding, broadcasting."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx
from dynshape.ir.graph import Graph, Node, Value
from dynshape.ir.infer import infer_graph

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


def _vi(name: str, shape: list | None, elem: int = F32) -> object:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes: list, inputs: list, inits: list = (), outputs: list | None = None) -> object:
    outs = outputs or [_vi(nodes[-1].output[0], None)]
    g = helper.make_graph(nodes, "t", inputs, outs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_contradiction_names_node_inputs_facts_and_fix() -> None:
    m = _model([helper.make_node("Add", ["x", "y"], ["z"], name="residual")],
               [_vi("x", ["batch", "seq", 16]), _vi("y", ["batch", 128, 16])])
    with pytest.raises(ds.ShapeError) as e:
        load_onnx(m, dims={"seq": {"min": 2, "max": 64}})
    msg = str(e.value)
    assert msg.startswith("node 'residual' (Add)")
    assert "x: float32[batch, seq, 16], y: float32[batch, 128, 16]" in msg
    assert "seq in [2, 64]" in msg and "input 'x' axis 1" in msg and "seq == 128" in msg
    assert "fix: seq must equal 128 here" in msg


def test_range_clash_between_two_inputs() -> None:
    m = _model([helper.make_node("Concat", ["x", "y"], ["z"], name="cat", axis=1)],
               [_vi("x", ["b", 16]), _vi("y", ["c", 8])])
    with pytest.raises(ds.ShapeError, match=r"(?s)node 'cat' \(Concat\).*b in \[1, 4\].*c in \[8, 16\]"):
        load_onnx(m, dims={"b": (1, 4), "c": (8, 16)})


def test_static_mismatch_names_the_node() -> None:
    m = _model([helper.make_node("MatMul", ["x", "w"], ["z"], name="proj")], [_vi("x", ["b", 16]), _vi("w", [32, 8])])
    with pytest.raises(ds.ShapeError, match=r"(?s)node 'proj' \(MatMul\).*16.*32"):
        load_onnx(m)


def test_equal_dims_merge_and_keep_provenance() -> None:
    m = _model([helper.make_node("Concat", ["x", "y"], ["z"], name="cat", axis=1)],
               [_vi("x", ["b", 16]), _vi("y", ["c", 8])])
    g = load_onnx(m, dims={"b": (1, 64), "c": (8, 128)})
    (merged,) = [d for d in g.outputs[0].shape if ds.is_expr(d)]
    s = merged.atom()
    assert (s.lo, s.hi) == (8, 64)
    assert g.inputs[0].shape[0] == g.inputs[1].shape[0] == merged  # both inputs now show one symbol
    assert any(f.kind == "eq" and "node 'cat'" in f.origin for f in g.signature.facts)
    with pytest.raises(ds.ConstraintViolation, match="must equal"):
        g.run({"x": np.ones((8, 16), np.float32), "y": np.ones((9, 8), np.float32)})


def test_bare_symbol_divisibility_refines_the_declaration() -> None:
    shape = helper.make_tensor("s", I64, [3], [0, -1, 32])
    g = load_onnx(_model([helper.make_node("Reshape", ["x", "s"], ["z"], name="heads")], [_vi("x", ["b", "H"])],
                         [shape]), dims={"H": {"multiple_of": 16}})
    H = g.signature.symbols["H"]
    assert H.atom().mult == 32
    assert g.outputs[0].shape == (g.signature.symbols["b"], H // 32, 32)
    assert [f.origin for f in g.signature.facts if f.kind == "range"] == ["node 'heads' (Reshape)"]


def test_named_dims_default_to_min_0_and_can_be_tightened() -> None:
    """ONNX admits empty tensors, so a dim_param admits 0 unless declared otherwise (default_min=1 or dims)."""
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["n"])])
    assert load_onnx(m).signature.symbols["n"].atom().lo == 0
    assert load_onnx(m).run({"x": np.ones(0, np.float32)})["y"].shape == (0,)
    assert load_onnx(m, default_min=1).signature.symbols["n"].atom().lo == 1
    assert load_onnx(m, dims={"n": (1, None)}).signature.symbols["n"].atom().lo == 1
    with pytest.raises(ds.ConstraintViolation, match=r"n = 0 is outside its range \[1, inf\]"):
        load_onnx(m, default_min=1).run({"x": np.ones(0, np.float32)})


def test_constant_subgraphs_are_folded() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=F32),
             helper.make_node("Mul", ["sf", "two"], ["y"])]
    g = load_onnx(_model(nodes, [_vi("x", [3, 5])], [helper.make_tensor("two", F32, [], [2.0])]))
    np.testing.assert_array_equal(g.types["y"].value, np.array([6, 10], np.float32))
    assert "y" in g.constants() and "two" in g.constants()


def test_shape_values_stay_symbolic_through_arithmetic() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i"], ["n"], axis=0),
             helper.make_node("Add", ["n", "five"], ["n5"]),
             helper.make_node("Unsqueeze", ["n5", "ax"], ["shape"]),
             helper.make_node("ConstantOfShape", ["shape"], ["y"])]
    inits = [helper.make_tensor("i", I64, [], [0]), helper.make_tensor("five", I64, [], [5]),
             helper.make_tensor("ax", I64, [1], [0])]
    g = load_onnx(_model(nodes, [_vi("x", ["n", 2])], inits))
    n = g.signature.symbols["n"]
    assert g.outputs[0].shape == (n + 5,)  # onnx's own inference would give a fresh unknown here
    assert g.run({"x": np.ones((3, 2), np.float32)})["y"].shape == (8,)


def test_graph_built_by_hand_is_inferred_and_runs() -> None:
    n = ds.sym("n", max=16)
    g = Graph("manual", [Value("x", np.dtype(np.float32), (n, 3))], [Value("y", np.dtype(np.float32), None)],
              [Node("Relu", "", "r", {}, ["x"], ["y"])], opset_imports={"": 18})
    infer_graph(g)
    assert g.outputs[0].shape == (n, 3)
    assert g.numel_bound("y") == 48 and g.memory_bound().bytes == 2 * 48 * 4
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(g.run({"x": x})["y"], np.maximum(x, 0))


def test_declared_output_shape_that_contradicts_inference_is_reported_and_inference_wins() -> None:
    """As onnxruntime does: a stale output annotation is warned about, the computed shape is returned."""
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["n", 3])], outputs=[_vi("y", ["n", 4])])
    with pytest.warns(UserWarning, match=r"output 'y' axis 1 is declared 4 but inference gives 3"):
        g = load_onnx(m)
    assert g.outputs[0].shape[1] == 3
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["n", 3])], outputs=[_vi("y", ["n"])])
    with pytest.warns(UserWarning, match=r"output 'y' is declared with rank 1 but inference gives"):
        g = load_onnx(m)
    x = np.ones((2, 3), np.float32)
    assert g.run({"x": x})["y"].shape == (2, 3)
