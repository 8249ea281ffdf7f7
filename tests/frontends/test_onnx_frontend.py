"""load_onnx: dims and declarations, ordering, functions, and one clear ModelError for every broken model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx

F32 = TensorProto.FLOAT


def _vi(name: str, shape: list | None, elem: int = F32) -> object:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes: list, inputs: list, outputs: list | None = None, inits: list = (), opset: int = 18,
           **kw: object) -> onnx.ModelProto:
    outs = outputs or [_vi(nodes[-1].output[0], None)]
    g = helper.make_graph(nodes, "t", inputs, outs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], **kw)
    m.ir_version = 8
    return m


def _relu_model(shape: list) -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", shape)])


# ---- dims -----------------------------------------------------------------------------------------------
def test_dim_params_become_shared_symbols() -> None:
    m = _model([helper.make_node("Add", ["a", "b"], ["y"])], [_vi("a", ["n", 3]), _vi("b", ["n", 3])])
    g = load_onnx(m)
    assert list(g.signature.symbols) == ["n"]
    assert g.inputs[0].shape == g.inputs[1].shape == (g.signature.symbols["n"], 3)


@pytest.mark.parametrize(("decl", "expected"), [
    ((2, 64), "n in [2, 64]"),
    ({"min": 1, "max": 512, "multiple_of": 8}, "n in [8, 512], multiple of 8"),
    (ds.sym("n", max=10), "n in [1, 10]"),
])
def test_dims_declarations(decl: object, expected: str) -> None:
    g = load_onnx(_relu_model(["n", 4]), dims={"n": decl})
    assert g.signature.symbols["n"].atom().describe() == expected
    assert expected in str(g)


def test_int_dim_declaration_fixes_the_dim() -> None:
    g = load_onnx(_relu_model(["n", 4]), dims={"n": 7})
    assert g.outputs[0].shape == (7, 4) and not g.signature.symbols


@pytest.mark.parametrize(("dims", "pattern"), [
    ({"m": (1, 4)}, r"dims declares \['m'\], which the model's inputs do not use \(its named dims: n\)"),
    ({"n": {"max": 4, "step": 2}}, r"dims\['n'\] has unknown keys \['step'\]"),
    ({"n": (9, 4)}, r"dims\['n'\] = \(9, 4\) is not a valid declaration.*min=9 > max=4"),
    ({"n": "big"}, r"dims\['n'\] = 'big': expected"),
])
def test_bad_dims_declarations(dims: dict, pattern: str) -> None:
    with pytest.raises(ds.ModelError, match=pattern):
        load_onnx(_relu_model(["n", 4]), dims=dims)


def test_unknown_dims_become_fresh_symbols_named_after_input_and_axis() -> None:
    m = _relu_model([None, "?", 3])
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_value = -1
    g = load_onnx(m)
    assert [str(d) for d in g.inputs[0].shape] == ["x_0", "x_1", "x_2"]
    assert g.run({"x": np.ones((2, 5, 1), np.float32)})["y"].shape == (2, 5, 1)


# ---- structure -------------------------------------------------------------------------------------------
def test_nodes_out_of_order_are_sorted() -> None:
    nodes = [helper.make_node("Neg", ["h"], ["y"], name="second"), helper.make_node("Relu", ["x"], ["h"], name="first")]
    g = load_onnx(_model(nodes, [_vi("x", ["n"])], [_vi("y", None)]))
    assert [n.name for n in g.nodes] == ["first", "second"]
    np.testing.assert_array_equal(g.run({"x": np.array([-1, 2], np.float32)})["y"], [0, -2])


def test_initializers_become_constants_and_attributes_are_decoded() -> None:
    w = helper.make_tensor("w", F32, [2, 3], np.arange(6, dtype=np.float32))
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], name="t", perm=[1, 0]),
             helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    g = load_onnx(_model(nodes, [_vi("x", ["n", 2])], [_vi("y", None)], [w]))
    np.testing.assert_array_equal(g.initializers["w"], np.arange(6).reshape(2, 3))
    assert g.nodes[0].attrs == {"perm": [1, 0]}
    assert g.types["wt"].value.shape == (3, 2)  # folded
    assert g.opset_imports == {"": 18}


def test_model_local_function_is_inlined() -> None:
    fn = helper.make_function("local", "Swish", ["x"], ["y"],
                              [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
                              [helper.make_opsetid("", 18)])
    m = _model([helper.make_node("Swish", ["a"], ["b"], name="act", domain="local")], [_vi("a", ["n"])],
               [_vi("b", None)], functions=[fn])
    m.opset_import.append(helper.make_opsetid("local", 1))
    g = load_onnx(m)
    assert [n.op_type for n in g.nodes] == ["Sigmoid", "Mul"] and g.nodes[0].name.startswith("act/")
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    np.testing.assert_allclose(g.run({"a": x})["b"], x / (1 + np.exp(-x)), rtol=1e-6)


def test_old_opsets_load() -> None:
    m = _model([helper.make_node("Not", ["x"], ["y"])], [_vi("x", ["n"], TensorProto.BOOL)],
               [_vi("y", None, TensorProto.BOOL)], opset=1)
    assert load_onnx(m).run({"x": np.array([True, False])})["y"].tolist() == [False, True]


# ---- broken models -------------------------------------------------------------------------------------
def _raises(model: object, pattern: str) -> ds.ModelError:
    with pytest.raises(ds.ModelError, match=pattern) as e:
        load_onnx(model)
    assert e.value.__cause__ is None  # one clear message, not a chained traceback
    return e.value


def test_unsupported_ops_are_listed_together_with_counts() -> None:
    nodes = [helper.make_node("Foo", ["x"], ["a"], name="foo1", domain="acme"),
             helper.make_node("Foo", ["a"], ["b"], name="foo2", domain="acme"),
             helper.make_node("Relu", ["b"], ["c"]),
             helper.make_node("FusedMatMul", ["c", "c"], ["y"], name="fmm", domain="com.microsoft")]
    m = _model(nodes, [_vi("x", ["n"])], [_vi("y", None)])
    m.opset_import.extend([helper.make_opsetid("acme", 1), helper.make_opsetid("com.microsoft", 1)])
    err = _raises(m, "2 op type")
    assert "acme::Foo x2 (e.g. node 'foo1')" in str(err)
    assert "com.microsoft::FusedMatMul x1 (e.g. node 'fmm')" in str(err)


def test_truncated_and_garbage_files(tmp_path: Path) -> None:
    data = _relu_model(["n"]).SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.onnx").write_bytes(b"\xff\xfenot a model at all" * 3)
    _raises(str(tmp_path / "cut.onnx"), r"cannot read .*cut\.onnx.*truncated or not an ONNX model")
    _raises(str(tmp_path / "junk.onnx"), r"junk\.onnx")
    _raises(str(tmp_path / "missing.onnx"), r"no ONNX model at .*missing\.onnx")
    _raises(b"", r"no graph")
    _raises(42, r"expects a path, bytes or onnx.ModelProto")


def test_cycle_is_reported_with_its_nodes() -> None:
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="A"), helper.make_node("Neg", ["a"], ["b"], name="B"),
             helper.make_node("Add", ["x", "a"], ["y"], name="C")]
    _raises(_model(nodes, [_vi("x", ["n"])], [_vi("y", None)]), r"cycle through nodes \['A', 'B', 'C'\]")


def test_dangling_input_names_the_node() -> None:
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")]
    _raises(_model(nodes, [_vi("x", ["n"])]), r"node 'adder' \(Add\) reads 'ghost'.*dangling")


def test_wrong_attribute_type_names_the_node() -> None:
    node = helper.make_node("Transpose", ["x"], ["y"], name="tr", perm=[1.0, 0.0])
    _raises(_model([node], [_vi("x", ["n", 2])]), r"node 'tr' \(Transpose\): attribute 'perm' has type FLOATS, "
                                                  "expected INTS")


def test_unknown_attribute_names_the_node() -> None:
    node = helper.make_node("Relu", ["x"], ["y"], name="r", alpha=0.1)
    _raises(_model([node], [_vi("x", ["n"])]), r"node 'r' \(Relu\): unknown attribute 'alpha'")


def test_missing_required_attribute_names_the_node() -> None:
    _raises(_model([helper.make_node("Cast", ["x"], ["y"], name="c")], [_vi("x", ["n"])]),
            r"node 'c' \(Cast\): missing required attribute\(s\) 'to'")


def test_two_producers_of_one_value() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Neg", ["x"], ["y"], name="b")]
    _raises(_model(nodes, [_vi("x", ["n"])], [_vi("y", None)]), r"'y' is produced twice")


def test_input_without_shape_or_output_without_producer() -> None:
    _raises(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", None)]), r"input 'x' has no shape")
    _raises(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["n"])], [_vi("z", None)]),
            r"output 'z' is produced by no node")


def test_subgraph_reads_outer_values_and_dangling_names_inside_are_caught() -> None:
    body = helper.make_graph([helper.make_node("Neg", ["x"], ["o"], name="inner")], "b", [], [_vi("o", None)])
    ok = _model([helper.make_node("If", ["c"], ["y"], name="if", then_branch=body, else_branch=body)],
                [_vi("c", [], TensorProto.BOOL), _vi("x", ["n"])])
    assert load_onnx(ok).run({"c": np.array(True), "x": np.ones(2, np.float32)})["y"].tolist() == [-1, -1]
    bad = helper.make_graph([helper.make_node("Neg", ["nowhere"], ["o"], name="inner2")], "b", [], [_vi("o", None)])
    _raises(_model([helper.make_node("If", ["c"], ["y"], name="if", then_branch=bad, else_branch=body)],
                   [_vi("c", [], TensorProto.BOOL), _vi("x", ["n"])]), r"node 'inner2' \(Neg\) reads 'nowhere'")
