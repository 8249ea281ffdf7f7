"""Issue 15, defects 6-8 and 10-14, and issue 12's "bad input": malformed models are refused at load with one
`DynshapeError` naming the node (arity, opsets, attribute values, dtypes, external data), folding never
materialises a huge constant, and a resolution too small for a conv window is refused per call by name."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from tolerance import assert_f32_close

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def vi(name: str, shape: list | None, elem: int = F32):
    return helper.make_tensor_value_info(name, elem if shape is not None else 0, shape)


def model(nodes: list, inputs: list, outputs: list, inits: dict | None = None, opset: int = 18) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", inputs, outputs,
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def refused(m: onnx.ModelProto, pattern: str, error: type = ds.DynshapeError) -> str:
    with pytest.raises(error, match=pattern) as e:
        ds.load_onnx(m)
    return str(e.value)


X23 = [vi("x", [2, 3])]
Y = [vi("y", None)]


# ---- 6: arity --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("node", "pattern"), [
    (helper.make_node("Add", ["x"], ["y"], name="n"), r"node 'n' \(Add\) has 1 input\(s\); Add takes exactly 2"),
    (helper.make_node("Mul", ["x"], ["y"], name="n"), r"'n' \(Mul\) has 1 input"),
    (helper.make_node("Greater", ["x"], ["y"], name="n"), r"'n' \(Greater\) has 1 input"),
    (helper.make_node("Add", ["x", "x", "x"], ["y"], name="n"), r"has 3 input\(s\); Add takes exactly 2"),
    (helper.make_node("LayerNormalization", ["x"], ["y"], name="n"), r"has 1 input\(s\); .*takes 2 to 3"),
    (helper.make_node("Pad", ["x", "p", "v", "a", "z"], ["y"], name="n"), r"has 5 input\(s\); Pad takes 2 to 4"),
    (helper.make_node("ScatterND", ["x", "p"], ["y"], name="n"), r"has 2 input\(s\); ScatterND takes exactly 3"),
    (helper.make_node("TopK", ["x", ""], ["y", "i"], name="n"), r"'n' \(TopK\): input 1 \('K'\) is required"),
    (helper.make_node("Relu", ["x"], ["y", "q"], name="n"), r"has 2 output\(s\); Relu gives exactly 1"),
])
def test_node_arity_is_checked_at_load_with_the_node_name(node, pattern):
    inits = {"p": np.zeros(4, np.int64), "v": np.float32(0), "a": np.array([0]), "z": np.array([0])}
    refused(model([node], X23, Y, inits), pattern, ds.ModelError)


def test_arity_error_happens_before_compile():
    """`Add` with one input used to reach codegen and raise IndexError inside ds.compile."""
    with pytest.raises(ds.ModelError, match="Add takes exactly 2"):
        ds.compile(ds.load_onnx(model([helper.make_node("Add", ["x"], ["y"])], X23, Y)))


# ---- 7: attribute values the shape rules rely on -----------------------------------------------------------
@pytest.mark.parametrize(("node", "pattern"), [
    (helper.make_node("Transpose", ["x"], ["y"], perm=[0, 0], name="n"), r"'n' \(Transpose\).*perm \[0, 0\] is not a "
                                                                       "permutation"),
    (helper.make_node("Transpose", ["x"], ["y"], perm=[0, 1, 2], name="n"), r"perm \[0, 1, 2\] is not a permutation"),
    (helper.make_node("Softmax", ["x"], ["y"], axis=5, name="n"), r"\(Softmax\).*axis 5 is out of range for rank 2"),
    (helper.make_node("Flatten", ["x"], ["y"], axis=-7, name="n"), r"'n' \(Flatten\).*axis -7"),
])
def test_bad_axis_and_perm_attributes_are_shape_errors_naming_the_node(node, pattern):
    refused(model([node], X23, Y), pattern, ds.ShapeError)


CONV_X = [vi("x", [1, 1, "H", "W"])]
W33 = {"w": np.ones((2, 1, 3, 3), np.float32)}


@pytest.mark.parametrize(("attrs", "pattern"), [
    ({"strides": [0, 1]}, r"strides \[0, 1\] must be >= 1"),
    ({"dilations": [1, -2]}, r"dilations \[1, -2\] must be >= 1"),
    ({"strides": [1, 1, 1]}, r"strides \[1, 1, 1\] has 3 entries; the input has 2 spatial axes"),
    ({"pads": [0, -1, 0, 0]}, r"pads \[0, -1, 0, 0\] must be >= 0"),
    ({"pads": [1, 1]}, r"pads \[1, 1\] has 2 entries; 2 spatial axes need 4"),
    ({"kernel_shape": [5, 5]}, r"kernel_shape \[5, 5\] disagrees with the weights' spatial shape \[3, 3\]"),
    ({"group": 0}, r"group 0 must be >= 1"),
    ({"auto_pad": "SOMETIMES"}, r"auto_pad 'SOMETIMES' is not one of"),
])
def test_conv_window_attributes_are_checked_in_the_shape_rule(attrs, pattern):
    refused(model([helper.make_node("Conv", ["x", "w"], ["y"], name="c", **attrs)], CONV_X, Y, W33),
            r"node 'c' \(Conv\).*" + pattern, ds.ShapeError)


def test_pool_pads_and_strides_are_checked():
    refused(model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[-1, 0, 0, 0], name="p")],
                  CONV_X, Y), r"node 'p' \(MaxPool\).*pads \[-1, 0, 0, 0\] must be >= 0", ds.ShapeError)
    refused(model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[1, 0], name="p")],
                  CONV_X, Y), r"strides \[1, 0\] must be >= 1", ds.ShapeError)


# ---- 8: Resize / Range / dtypes -----------------------------------------------------------------------------
def test_resize_with_neither_scales_nor_sizes_is_refused():
    refused(model([helper.make_node("Resize", ["x"], ["y"], name="r")], [vi("x", [1, 1, 2, 3])], Y),
            r"node 'r' \(Resize\): give exactly one of scales and sizes .*neither", ds.ShapeError)
    refused(model([helper.make_node("Resize", ["x", "", "s", "z"], ["y"], name="r")], [vi("x", [1, 1, 2, 3])], Y,
                  {"s": np.ones(4, np.float32), "z": np.array([1, 1, 4, 6])}), r"not both", ds.ShapeError)


def test_resize_10_without_scales_is_an_arity_error():
    refused(model([helper.make_node("Resize", ["x"], ["y"], name="r")], [vi("x", [1, 1, 2, 3])], Y, opset=10),
            r"node 'r' \(Resize\) has 1 input\(s\); Resize takes exactly 2", ds.ModelError)


def test_range_with_delta_zero_is_a_clean_error_at_load_and_at_run():
    refused(model([helper.make_node("Range", ["a", "b", "c"], ["y"], name="r")], [], Y,
                  {"a": np.array(0), "b": np.array(5), "c": np.array(0)}), r"node 'r' \(Range\).*delta is 0",
            ds.ShapeError)
    m = model([helper.make_node("Range", ["a", "b", "c"], ["y"], name="r")],
              [vi("a", [], I64), vi("b", [], I64), vi("c", [], I64)], Y)
    exe = ds.compile(ds.load_onnx(m))
    with pytest.raises(ds.ConstraintViolation, match=r"node 'r' \(Range\).*delta is 0"):
        exe.run({"a": np.array(0), "b": np.array(5), "c": np.array(0)})


def test_softmax_of_strings_and_mixed_dtypes_are_model_errors():
    refused(model([helper.make_node("Softmax", ["x"], ["y"], name="s")], [vi("x", [2, 3], TensorProto.STRING)], Y),
            r"node 's' \(Softmax\): input 0 .* is a tensor of string, which Softmax does not take", ds.ModelError)
    refused(model([helper.make_node("Add", ["x", "i"], ["y"], name="a")], [vi("x", [2]), vi("i", [2], I64)], Y),
            r"node 'a' \(Add\).*(same element type|share one dtype)", ds.DynshapeError)


# ---- 10: integer attributes reaching C -------------------------------------------------------------------
@pytest.mark.parametrize("flag", [2**32, -(2**63), 3, -1])
def test_flag_attributes_outside_0_1_are_refused_not_truncated(flag):
    """transB = 2**32 reached C truncated to 0 (a silent wrong result); runtimes disagree on what such a flag
    means (onnxruntime's Gemm reads != 0, its TopK == 1), so any value but 0 and 1 is refused by name."""
    w = np.ones((3, 3), np.float32)
    m = model([helper.make_node("Gemm", ["x", "w"], ["y"], transB=flag, name="g")], [vi("x", ["n", 3])],
              [vi("y", ["n", 3])], {"w": w})
    refused(m, r"node 'g' \(Gemm\): attribute 'transB' = .* is a flag and must be 0 or 1", ds.ModelError)
    m = model([helper.make_node("TopK", ["x", "k"], ["v", "i"], largest=flag, name="t")], [vi("x", [2, 3])],
              [vi("v", [2, 1]), vi("i", [2, 1], I64)], {"k": np.array([1])})
    refused(m, r"node 't' \(TopK\): attribute 'largest'", ds.ModelError)


@pytest.mark.parametrize("flag", [0, 1])
def test_gemm_flags_agree_with_onnxruntime(flag):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 3)).astype(np.float32)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    m = model([helper.make_node("Gemm", ["x", "w"], ["y"], transB=flag)], [vi("x", ["n", 3])],
              [vi("y", ["n", 3])], {"w": w})
    out = ds.compile(ds.load_onnx(m)).run({"x": x})["y"]
    assert_f32_close(out, x @ (w.T if flag else w), rtol=1e-5, scale=1e-5)
    ort = pytest.importorskip("onnxruntime")
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert_f32_close(out, ref, rtol=1e-5, scale=1e-5)


def test_non_utf8_names_are_a_model_error():
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], X23, Y)
    data = m.SerializeToString().replace(b"Relu", b"R\xffl\xfe")
    refused(data, r"field 'op_type' holds bytes that are not UTF-8 text", ds.ModelError)


# ---- 11: folding never materialises a huge constant ---------------------------------------------------------
def test_load_time_folding_stops_at_a_size_limit():
    m = model([helper.make_node("ConstantOfShape", ["s"], ["y"])], [], Y, {"s": np.array([30000, 30000])})
    assert len(m.SerializeToString()) < 200
    t0 = time.perf_counter()
    g = ds.load_onnx(m)
    assert time.perf_counter() - t0 < 2
    t = g.types["y"]
    assert t.shape == (30000, 30000) and t.value is None  # the node stays for run time


def test_range_with_a_huge_constant_length_is_not_materialised_at_load():
    m = model([helper.make_node("Range", ["a", "b", "c"], ["y"])], [], Y,
              {"a": np.array(0), "b": np.array(10**12), "c": np.array(1)})
    t0 = time.perf_counter()
    assert ds.load_onnx(m).types["y"].shape == (10**12,)
    assert time.perf_counter() - t0 < 2


# ---- 12: what onnx's checker (and onnxruntime) refuses --------------------------------------------------------
def test_op_below_the_opset_that_introduced_it_is_refused():
    refused(model([helper.make_node("Gelu", ["x"], ["y"], name="g")], X23, Y, opset=18),
            r"node 'g' \(Gelu\): Gelu does not exist at ai.onnx opset 18 \(it was introduced at opset 20\)",
            ds.ModelError)


def test_deprecated_op_is_refused():
    refused(model([helper.make_node("Upsample", ["x", "s"], ["y"], name="u")], [vi("x", [1, 1, 2, 2])], Y,
                  {"s": np.ones(4, np.float32)}, opset=10), r"Upsample is deprecated at ai.onnx opset 10",
            ds.ModelError)


def test_graph_with_no_outputs_is_refused():
    refused(model([helper.make_node("Relu", ["x"], ["y"])], X23, []), r"declares no outputs", ds.ModelError)


def test_declared_output_dtype_that_disagrees_with_inference_is_refused():
    refused(model([helper.make_node("Relu", ["x"], ["y"])], X23, [vi("y", [2, 3], I64)]),
            r"graph output 'y' is declared int64 but the model computes float32", ds.ModelError)


@pytest.mark.parametrize(("version", "pattern"), [(0, "opset versions start at 1"), (10**4, "newer than any")])
def test_impossible_opset_imports_are_refused(version, pattern):
    m = model([helper.make_node("Relu", ["x"], ["y"])], X23, Y)
    m.opset_import[0].version = version
    refused(m, pattern, ds.ModelError)


def test_missing_default_opset_import_is_refused():
    m = model([helper.make_node("Relu", ["x"], ["y"])], X23, Y)
    del m.opset_import[:]
    refused(m, r"imports no ai.onnx opset", ds.ModelError)


# ---- 13: external data -----------------------------------------------------------------------------------
def _external_model(tmp: Path, location: str) -> onnx.ModelProto:
    t = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "b")
    t.data_location = TensorProto.EXTERNAL
    t.ClearField("raw_data")
    for k, v in (("location", location), ("offset", "0"), ("length", "24")):
        e = t.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "t", X23, [vi("y", [2, 3])], [t])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_external_data_is_read_from_the_model_folder_when_loaded_by_path(tmp_path, monkeypatch):
    (tmp_path / "w.bin").write_bytes(np.arange(6, dtype=np.float32).tobytes())
    m = _external_model(tmp_path, "w.bin")
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    monkeypatch.chdir(tmp_path.parent)  # not the model's folder: the folder, never the cwd, is the base
    g = ds.load_onnx(str(path))
    np.testing.assert_array_equal(g.run({"x": np.zeros((2, 3), np.float32)})["y"], np.arange(6).reshape(2, 3))


def test_external_data_from_bytes_or_proto_is_refused_not_read_from_the_cwd(tmp_path, monkeypatch):
    (tmp_path / "w.bin").write_bytes(np.arange(6, dtype=np.float32).tobytes())
    monkeypatch.chdir(tmp_path)  # the file is right here: it must still not be read
    m = _external_model(tmp_path, "w.bin")
    for given in (m, m.SerializeToString()):
        refused(given, r"tensor 'b' keeps its data in an external file \('w.bin'\).*pass the model's path",
                ds.ModelError)


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin", "link.bin"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, location):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 24)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "link.bin").symlink_to(tmp_path / "secret.bin")
    path = folder / "m.onnx"
    path.write_bytes(_external_model(folder, location).SerializeToString())
    refused(str(path), r"outside the model's folder|not a plain relative path", ds.ModelError)


def test_external_data_that_is_not_a_regular_file_is_refused(tmp_path):
    (tmp_path / "w.bin").mkdir()
    path = tmp_path / "m.onnx"
    path.write_bytes(_external_model(tmp_path, "w.bin").SerializeToString())
    refused(str(path), r"not a regular file", ds.ModelError)


# ---- 14: Loop / If scalars -------------------------------------------------------------------------------
def _loop(trip_shape: list, inits: dict | None = None) -> onnx.ModelProto:
    body = helper.make_graph([helper.make_node("Identity", ["v"], ["vo"]), helper.make_node("Identity", ["c"], ["co"])],
                             "body", [vi("i", [], I64), vi("c", [], BOOL), vi("v", [4])],
                             [vi("co", [], BOOL), vi("vo", [4])])
    inputs = [vi("x", [4])] + ([] if inits else [vi("m", trip_shape, I64)])
    return model([helper.make_node("Loop", ["m", "", "x"], ["y"], body=body, name="loop")], inputs, Y, inits)


def test_loop_trip_count_that_is_not_a_scalar_is_refused():
    refused(_loop([3]), r"node 'loop' \(Loop\): the trip count M must be a scalar \(one element\); it has shape \[3\]",
            ds.ShapeError)
    refused(_loop([3], {"m": np.array([2, 3, 4])}), r"trip count M must be a scalar", ds.ShapeError)


def test_a_loop_whose_body_takes_another_count_of_values_is_refused():
    """Fuzzer case 12439 (seed 1207): a Loop given two loop-carried values for a body that takes one ran the body
    on its first inputs, and the compiled build disagreed with the reference one (onnxruntime refuses the model).
    The body's inputs must be the iteration number, the condition and the carried values; its outputs the
    condition, then the carried values, then the scan outputs."""
    m = _loop([])
    m.graph.node[0].input.append("x")
    refused(m, r"node 'loop' \(Loop\): its body graph 'body' takes 3 inputs, but the node gives it 4", ds.ShapeError)
    m = _loop([])
    del m.graph.node[0].attribute[0].g.output[1]
    refused(m, r"node 'loop' \(Loop\): the body returns 1 values, but a Loop with 1 loop-carried values needs the "
               r"condition and those 1 first", ds.ShapeError)


def test_loop_trip_count_of_symbolic_length_is_checked_per_call():
    exe = ds.compile(ds.load_onnx(_loop(["k"])))
    assert exe.run({"x": np.ones(4, np.float32), "m": np.array([2])})["y"].shape == (4,)  # one element: as ORT
    with pytest.raises(ds.ConstraintViolation, match=r"input 'm' axis 0 .*is 2"):  # k == 1 is now a fact
        exe.run({"x": np.ones(4, np.float32), "m": np.array([2, 3])})


# ---- issue 12: a resolution smaller than the window ------------------------------------------------------------
def test_resolution_smaller_than_the_conv_window_is_refused_naming_input_axis_symbol_and_fact():
    g = ds.load_onnx(model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], CONV_X, Y, W33))
    exe = ds.compile(g)
    assert exe.run({"x": np.ones((1, 1, 3, 5), np.float32)})["y"].shape == (1, 2, 1, 3)
    for run in (exe.run, g.run):
        with pytest.raises(ds.ConstraintViolation) as e:
            run({"x": np.ones((1, 1, 2, 5), np.float32)})
        msg = str(e.value)
        for part in ("input 'x' axis 2", "H = 2", "H - 2 >= 1", "covers the Conv window", "node 'conv' (Conv)"):
            assert part in msg, msg


def test_padding_that_admits_an_empty_axis_still_refuses_a_too_short_one():
    """pads (0, 1) and stride 2 along W: W = 0 gives an empty output (valid), W = 1 a 0-wide one from a
    non-empty input (refused), W = 2 one column."""
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[0, 1, 0, 0], strides=[1, 2])],
              CONV_X, Y, W33)
    exe = ds.compile(ds.load_onnx(m))
    assert exe.run({"x": np.ones((1, 1, 3, 0), np.float32)})["y"].shape == (1, 2, 1, 0)
    assert exe.run({"x": np.ones((1, 1, 3, 2), np.float32)})["y"].shape == (1, 2, 1, 1)
    with pytest.raises(ds.ConstraintViolation, match=r"or axis empty: input 'x' axis 3 \(W\).*W = 1"):
        exe.run({"x": np.ones((1, 1, 3, 1), np.float32)})


def test_declared_divisibility_is_refused_naming_input_axis_symbol():
    m = model([helper.make_node("Relu", ["x"], ["y"])], CONV_X, Y)
    exe = ds.compile(ds.load_onnx(m, dims={"H": {"min": 32, "multiple_of": 32}}))
    with pytest.raises(ds.ConstraintViolation, match=r"input 'x' axis 2 \(H\) is 40: H = 40 is not a multiple of 32"):
        exe.run({"x": np.ones((1, 1, 40, 4), np.float32)})


# ---- found by bench/fuzz_models.py -----------------------------------------------------------------------------
@pytest.mark.parametrize(("nodes", "inputs", "inits", "pattern"), [
    ([helper.make_node("CumSum", ["x", "a"], ["y"], name="n")], X23, {"a": np.array(5)},
     r"'n' \(CumSum\).*axis 5 is out of range for rank 2"),
    ([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="CRD", name="n")], [vi("x", [1, 1, 2, 2])],
     {"s": np.ones(4, np.float32)}, r"'n' \(Resize\): mode 'CRD' is not one of"),
    ([helper.make_node("Resize", ["x", "", "s"], ["y"], name="n")], [vi("x", [1, 1, 2, 2])],
     {"s": np.ones((4, 1), np.float32)}, r"scales\) must be 1-D"),
    ([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="n")], [vi("x", [1, 1, 4, 4])],
     {"w": np.ones((2, 1, 3, 3), np.float32), "b": np.ones((2, 1), np.float32)}, r"bias must be 1-D"),
    ([helper.make_node("ConvTranspose", ["x", "w"], ["y"], pads=[1, -1, 1, 1], name="n")], [vi("x", [1, 1, 4, 4])],
     {"w": np.ones((1, 2, 3, 3), np.float32)}, r"pads \[1, -1, 1, 1\] must be >= 0"),
    ([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], pads=[0, 2, 0, 0], name="n")],
     [vi("x", [1, 1, 4, 4])], None, r"pads \[0, 2, 0, 0\] must be smaller than kernel_shape \[2, 2\]"),
    ([helper.make_node("Pad", ["x", "p", "x"], ["y"], name="n")], X23, {"p": np.array([0, 1, 0, 1])},
     r"constant_value must be a scalar"),
    ([helper.make_node("Pad", ["x", "p"], ["y"], name="n")], X23, {"p": np.array([[0, 1], [0, 1]])},
     r"pads must be a 1-D tensor"),
    ([helper.make_node("Pad", ["x", "p"], ["y"], name="n")], X23, {"p": np.array([0, -4, 0, 0])},
     r"pads \[0, -4, 0, 0\] crop axis 1 \(3\) to -1 < 0"),
    ([helper.make_node("Cast", ["x"], ["y"], to=-5, name="n")], X23, None,
     r"attribute 'to' = -5 is not an ONNX element type"),
])
def test_fuzzer_found_models_are_refused_at_load(nodes, inputs, inits, pattern):
    refused(model(nodes, inputs, Y, inits), pattern)


def test_cumsum_axis_out_of_range_at_run_time_is_refused_not_wrapped():
    m = model([helper.make_node("CumSum", ["x", "a"], ["y"], name="n")], [vi("x", [2, 3]), vi("a", [], I64)], Y)
    exe = ds.compile(ds.load_onnx(m))
    with pytest.raises(ds.ConstraintViolation, match=r"node 'n' \(CumSum\).*axis 2 is out of range for rank 2"):
        exe.run({"x": np.ones((2, 3), np.float32), "a": np.array(2)})


def test_negative_pads_that_crop_a_symbolic_axis_below_zero_are_refused_per_call():
    m = model([helper.make_node("Pad", ["x", "p"], ["y"], name="n")], [vi("x", [2, "L"])], Y,
              {"p": np.array([0, -2, 0, 0])})
    exe = ds.compile(ds.load_onnx(m))
    assert exe.run({"x": np.ones((2, 3), np.float32)})["y"].shape == (2, 1)
    with pytest.raises(ds.ConstraintViolation, match=r"L = 1"):
        exe.run({"x": np.ones((2, 1), np.float32)})


def test_initializer_with_a_negative_dim_is_refused():
    m = model([helper.make_node("Relu", ["w"], ["y"])], [], Y, {"w": np.ones(3, np.float32)})
    m.graph.initializer[0].dims[0] = -1
    refused(m, r"initializer 'w': dims \[-1\] has a negative entry", ds.ModelError)


def test_ir_versions_onnx_cannot_read_are_refused():
    m = model([helper.make_node("Relu", ["x"], ["y"])], X23, Y)
    m.ir_version = onnx.IR_VERSION + 1
    refused(m, r"IR version .* newer than this onnx reads", ds.ModelError)
    m = model([helper.make_node("Add", ["x", "b"], ["y"])], X23, Y, {"b": np.ones((2, 3), np.float32)})
    m.ir_version = 3
    refused(m, r"IR version 3, where every initializer must also be a graph input; 'b'", ds.ModelError)


def test_shape_with_more_elements_than_any_array_is_refused_even_next_to_a_zero_dim():
    """Reshape of an empty (0, S, 8) to (0, S, 2, 2**62): 0 elements either way, but numpy (and C's int64
    sizes) cannot hold that shape; it used to escape from plan binding as a raw ValueError."""
    m = model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")], [vi("x", [0, "S", 8])], Y,
              {"s": np.array([0, 0, 2, 2**62])})
    refused(m, r"node 'r' \(Reshape\): output 'y' would have shape \[0, S, 2, 4611686018427387904\], more than "
               r"2\*\*63 elements", ds.ShapeError)


@pytest.mark.parametrize("node, inits", [
    (helper.make_node("Tile", ["x", "r"], ["y"]), {"r": np.array([1 << 61, 1])}),
    (helper.make_node("Pad", ["x", "r"], ["y"]), {"r": np.array([0, 0, 0, (1 << 61) - 2])}),
], ids=["Tile", "Pad"])
def test_a_memory_plan_past_int64_bytes_is_refused_by_name(node, inits):
    """Fuzzer cases 2519 and 2764 (seed 1207): a Tile by 2**61 repeats, a Pad of 2**61 columns, each within
    2**63 elements, so the shape rules take them; their buffers' bytes then passed int64 where the memory plan
    handed them to its C first-fit, and a raw OverflowError escaped. The call is refused by name instead."""
    exe = ds.compile(ds.load_onnx(model([node], [vi("x", ["B", 4])], Y, inits)))
    for _ in range(2):  # and again: the refusal left nothing half-done
        with pytest.raises(ds.ConstraintViolation, match=r"value 'y' would have shape \(\d+, \d+\) at "
                                                          r"\{'B': 2\}: \d+ bytes, .* more than any memory plan"):
            exe.run({"x": np.ones((2, 4), np.float32)})
