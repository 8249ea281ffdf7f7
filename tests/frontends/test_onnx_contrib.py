"""onnxruntime contrib ops in shipped files: `DynamicQuantizeLSTM` (from onnxruntime's own quantizer) loads as a
standard LSTM on dequantized weights and matches the float model as closely as onnxruntime's int8 kernel does."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")


def _float_lstm(path: str, hidden: int, inputs: int, direction: str) -> None:
    rng = np.random.default_rng(7)
    d = 2 if direction == "bidirectional" else 1
    w = rng.normal(0, 0.4, (d, 4 * hidden, inputs)).astype(np.float32)
    r = rng.normal(0, 0.4, (d, 4 * hidden, hidden)).astype(np.float32)
    b = rng.normal(0, 0.1, (d, 8 * hidden)).astype(np.float32)
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h", "y_c"], hidden_size=hidden,
                            direction=direction, name="lstm")
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", inputs])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "y_h", "y_c")],
        [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"))])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]), path)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_dynamic_quantize_lstm_matches_the_float_model_as_onnxruntime_does(tmp_path, direction) -> None:
    fp, qp = str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx")
    _float_lstm(fp, 16, 12, direction)
    quantization.quantize_dynamic(fp, qp, op_types_to_quantize=["LSTM"])
    assert any(n.op_type == "DynamicQuantizeLSTM" for n in onnx.load(qp).graph.node)
    exe = ds.compile(ds.load_onnx(qp))
    f_sess, q_sess = (ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for p in (fp, qp))
    rng = np.random.default_rng(1)
    for seq, batch in ((1, 1), (9, 3), (30, 2)):
        x = rng.normal(0, 1, (seq, batch, 12)).astype(np.float32)
        got = exe.run({"x": x})
        ref = dict(zip(("y", "y_h", "y_c"), f_sess.run(None, {"x": x})))
        theirs = dict(zip(("y", "y_h", "y_c"), q_sess.run(None, {"x": x})))
        for name in ("y", "y_h", "y_c"):
            assert got[name].shape == ref[name].shape
            scale = float(np.sqrt(np.mean(ref[name] ** 2))) + 1e-6
            ours = float(np.abs(got[name] - ref[name]).max()) / scale
            ort_err = float(np.abs(theirs[name] - ref[name]).max()) / scale
            # int8 weights move the result by a few % of its size; a wrong layout or gate order by ~100%
            assert ours < 0.15 and ours <= 1.5 * ort_err + 0.01, (name, seq, batch, ours, ort_err)


def test_dynamic_quantize_lstm_with_computed_weights_is_refused_by_name() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1, 4])
    w = helper.make_tensor_value_info("w", TensorProto.INT8, [1, 4, 8])
    node = helper.make_node("DynamicQuantizeLSTM", ["x", "w", "w", "", "", "", "", "", "s", "z", "s", "z"],
                            ["y"], domain="com.microsoft", hidden_size=2, name="qlstm")
    g = helper.make_graph([node], "g", [x, w], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.ones(1, np.float32), "s"),
                           numpy_helper.from_array(np.zeros(1, np.int8), "z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(ds.ModelError, match=r"node 'qlstm'.*W \(input 1, 'w'\) must be an initializer"):
        ds.load_onnx(m)
