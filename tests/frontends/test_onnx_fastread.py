"""The direct weight reader (frontends/onnx_fastread): the same model as onnx.load, or a clean fallback."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.errors import ModelError
from dynshape.frontends.onnx_fastread import DIRECT_BYTES, read_direct
from tolerance import assert_f32_close


def _model(path: str, weights: dict[str, np.ndarray], *, doc: str = "") -> str:
    """x (batch, 4) -> MatMul by each weight in turn (shapes chained) -> Add of the bias, saved at `path`."""
    nodes, cur = [], "x"
    inits = []
    for i, (name, w) in enumerate(weights.items()):
        inits.append(numpy_helper.from_array(w, name))
        if w.ndim == 2:
            nodes.append(helper.make_node("MatMul", [cur, name], [f"h{i}"]))
        else:
            nodes.append(helper.make_node("Add", [cur, name], [f"h{i}"]))
        cur = f"h{i}"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    last = [w for w in weights.values() if w.ndim == 2][-1].shape[1]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", last])], inits,
                          doc_string=doc)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], doc_string=doc)
    onnx.save(m, path)
    return path


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"w0": rng.standard_normal((4, 8192)).astype(np.float32),  # 128 KB: read directly
            "w1": rng.standard_normal((8192, 3)).astype(np.float32),  # 96 KB: read directly
            "b": rng.standard_normal((3,)).astype(np.float32),  # small: left to protobuf
            "w2": rng.standard_normal((3, 5)).astype(np.float32)}


def test_direct_read_gives_onnx_load_s_model_and_arrays(tmp_path):
    rng = np.random.default_rng(0)
    w = _weights(rng)
    path = _model(str(tmp_path / "m.onnx"), w, doc="a doc string")
    got = read_direct(path)
    assert got is not None
    proto, arrays = got
    ref = onnx.load(path)
    assert sorted(arrays) == [0, 1]  # the two initializers over DIRECT_BYTES
    for i, t in enumerate(ref.graph.initializer):
        want = numpy_helper.to_array(t)
        have = arrays[i] if i in arrays else numpy_helper.to_array(proto.graph.initializer[i])
        assert have.dtype == want.dtype and have.shape == want.shape
        np.testing.assert_array_equal(have, want)
        assert have.ctypes.data % 64 == 0 or i not in arrays  # own pages: aligned for any kernel
        assert proto.graph.initializer[i].name == t.name
    # everything but the direct raw_data fields is protobuf's own parse of the file
    for i in arrays:
        ref.graph.initializer[i].ClearField("raw_data")
    assert proto.SerializeToString() == ref.SerializeToString()


def test_load_onnx_from_a_path_matches_the_bytes_path(tmp_path):
    rng = np.random.default_rng(1)
    path = _model(str(tmp_path / "m.onnx"), _weights(rng))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    a = ds.compile(ds.load_onnx(path)).run({"x": x})
    b = ds.compile(ds.load_onnx(open(path, "rb").read())).run({"x": x})
    np.testing.assert_array_equal(a["y"], b["y"])
    w = _weights(np.random.default_rng(1))
    ref = (x @ w["w0"] @ w["w1"] + w["b"]) @ w["w2"]
    assert_f32_close(a["y"], ref, rtol=1e-4, scale=1e-6)  # outputs ~300


def test_a_loaded_graph_does_not_see_the_file_change_afterwards(tmp_path):
    rng = np.random.default_rng(2)
    path = str(tmp_path / "m.onnx")
    _model(path, _weights(rng))
    g = ds.load_onnx(path)
    before = {k: v.copy() for k, v in g.initializers.items()}
    with open(path, "r+b") as f:  # overwrite every weight byte, then cut the file short
        f.seek(100)
        f.write(b"\xff" * (os.path.getsize(path) - 200))
        f.truncate(300)
    for k, v in g.initializers.items():
        np.testing.assert_array_equal(v, before[k])


def test_small_models_and_non_onnx_suffixes_take_onnx_load(tmp_path):
    rng = np.random.default_rng(3)
    small = {"w": rng.standard_normal((4, 2)).astype(np.float32)}
    assert read_direct(_model(str(tmp_path / "s.onnx"), small)) is None  # nothing over DIRECT_BYTES
    other = _model(str(tmp_path / "m.bin"), _weights(rng))
    assert read_direct(other) is None
    assert ds.load_onnx(other).initializers["w0"].shape == (4, 8192)


@pytest.mark.parametrize("cut", [7, 1000, DIRECT_BYTES + 50])
def test_a_truncated_file_falls_back_and_is_reported_as_before(tmp_path, cut):
    rng = np.random.default_rng(4)
    path = _model(str(tmp_path / "m.onnx"), _weights(rng))
    data = open(path, "rb").read()
    open(path, "wb").write(data[:cut])
    assert read_direct(path) is None
    with pytest.raises(ModelError, match="truncated or not an ONNX model|no graph"):
        ds.load_onnx(path)


def test_a_raw_data_size_that_does_not_match_the_dims_falls_back(tmp_path):
    rng = np.random.default_rng(5)
    path = str(tmp_path / "m.onnx")
    _model(path, _weights(rng))
    m = onnx.load(path)
    m.graph.initializer[0].dims[1] = 8191  # 4 * 8191 floats declared, 4 * 8192 stored
    onnx.save(m, path)
    assert read_direct(path) is None
    with pytest.raises(ModelError, match="initializer 'w0'"):
        ds.load_onnx(path)


def test_external_data_models_take_the_checked_path(tmp_path):
    rng = np.random.default_rng(6)
    path = str(tmp_path / "m.onnx")
    _model(path, _weights(rng))
    m = onnx.load(path)
    want = numpy_helper.to_array(m.graph.initializer[0])
    onnx.save(m, path, save_as_external_data=True, location="m.data", size_threshold=1024)
    assert read_direct(path) is None
    np.testing.assert_array_equal(ds.load_onnx(path).initializers["w0"], want)
