"""The CNN benchmark's models (bench/cnn_models.py): tiny builds through the same builders and exporter as
bench/export_cnn_models.py, checked with onnxruntime against torch eager at shapes the symbols allow.

Skipped where torch or onnxruntime is absent (the benchmark's own extras, not dynshape's dependencies). Tiny
knobs (cnn_models.TINY) keep every op of the full architecture at a fraction of the work: the whole file runs
in a few seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tolerance import assert_f32_close

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
torch.set_num_threads(1)  # the machine is shared: two spinning pools cost more than they gain at these sizes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import cnn_models  # noqa: E402
import export_cnn_models as ex  # noqa: E402

# small shapes the symbols admit (the benchmark's probes reach 2x3x736x736: seconds of torch eager)
ENVS = {
    "text_det": ({"batch": 1, "H": 64, "W": 96}, {"batch": 2, "H": 160, "W": 32}),
    "text_rec": ({"batch": 1, "W": 17}, {"batch": 3, "W": 250}),
    "byte_cls": ({"batch": 1, "len": 64}, {"batch": 4, "len": 333}),
}


def _export_and_check(name: str, exporter: str, tmp_path: Path) -> dict:
    spec = cnn_models.SPECS[name]
    module = cnn_models.BUILDERS[name](**cnn_models.TINY[name])
    path = str(tmp_path / f"{name}.onnx")
    ex.export_torch(spec, module, path, exporter)
    return {"spec": spec, "path": path, "check": ex.check_vs_torch(spec, module, path, envs=ENVS[name])}


def test_text_det_tiny_matches_torch_at_two_resolutions(tmp_path: Path) -> None:
    r = _export_and_check("text_det", "torchscript", tmp_path)
    assert r["check"]["ok"], r["check"]["max_abs_diff"]
    assert set(r["check"]["max_abs_diff"]) == {"1x3x64x96", "2x3x160x32"}
    ops = ex.op_summary(__import__("onnx").load(r["path"]))
    # the ops the issue asks kernels for: depthwise 3x3 and 5x5, SE (pool, HardSigmoid, Mul), nearest Resize
    assert {"Conv", "ConvTranspose", "Resize", "HardSwish", "HardSigmoid", "Mul", "Concat"} <= set(ops["op_histogram"])
    convs = " ".join(ops["attributes"]["Conv"])
    assert "k3x3 dw" in convs and "k5x5 dw" in convs
    assert all(k.startswith("mode=nearest") for k in ops["attributes"]["Resize"])


def test_text_rec_tiny_lstm_export_keeps_the_width_symbolic(tmp_path: Path) -> None:
    r = _export_and_check("text_rec", "torchscript", tmp_path)
    assert r["check"]["ok"], r["check"]["max_abs_diff"]
    ops = ex.op_summary(__import__("onnx").load(r["path"]))
    assert ops["op_histogram"].get("LSTM") == 2
    assert all("direction=bidirectional" in k for k in ops["attributes"]["LSTM"])
    import onnx

    dims = [d.dim_param or d.dim_value for d in onnx.load(r["path"]).graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, 48, "W"]


def test_normalised_dims_bind_to_dynshape(tmp_path: Path) -> None:
    """The exported names are exactly the spec's, so load_onnx(dims=spec.dims) binds them (and runs)."""
    import dynshape as ds

    r = _export_and_check("byte_cls", "torchscript", tmp_path)
    assert r["check"]["ok"], r["check"]["max_abs_diff"]
    spec = r["spec"]
    g = ds.load_onnx(r["path"], dims=spec.dims)
    feed = spec.make_inputs({"batch": 3, "len": 200})
    got = g.run(feed)
    want = ex.ort_session(r["path"]).run(None, feed)
    got = list(got.values()) if isinstance(got, dict) else list(got)
    assert_f32_close(got[0], want[0], rtol=1e-3, scale=1e-4)


def test_inputs_are_deterministic_and_typed() -> None:
    spec = cnn_models.SPECS["byte_cls"]
    a, b = spec.make_inputs(spec.probes[0]), spec.make_inputs(spec.probes[0])
    assert a["bytes"].dtype == np.int64 and a["bytes"].shape == (1, 1024)
    np.testing.assert_array_equal(a["bytes"], b["bytes"])
    assert cnn_models.SPECS["text_det"].sym_range("H") == (32, 1536, 32)
