"""exe.run(feed, out={...}): outputs written into the caller's arrays (io-binding), checked before anything runs."""

import numpy as np
import pytest

import dynshape as ds
from dynshape.frontends.onnx import load_onnx
from dynshape.models.mlp import build_mlp


def _exe():
    g = load_onnx(build_mlp(), dims={"batch": (1, 64)})
    return g, ds.compile(g)


def test_out_arrays_are_filled_in_place_and_returned():
    g, exe = _exe()
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    want = exe.run({"x": x})["y"]
    buf = np.full((5, 64), np.nan, np.float32)
    got = exe.run({"x": x}, out={"y": buf})
    assert got["y"] is buf
    np.testing.assert_array_equal(buf, want)  # the same plan: bit for bit
    x2 = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    exe.run({"x": x2}, out={"y": buf})  # reused across calls, as a decode loop does
    np.testing.assert_array_equal(buf, exe.run({"x": x2})["y"])


@pytest.mark.parametrize("bad, match", [
    (np.zeros((4, 64), np.float32), r"float32\[4, 64\], but this call's output 'y' is float32\[5, 64\]"),
    (np.zeros((5, 64), np.float64), r"float64\[5, 64\], but this call's output 'y' is float32"),
    (np.zeros((64, 5), np.float32).T, "C-contiguous"),
    ([[0.0] * 64] * 5, "not a numpy array"),
])
def test_a_bad_out_array_is_refused_before_anything_runs(bad, match):
    g, exe = _exe()
    x = np.ones((5, 64), np.float32)
    calls = exe.stats_.calls
    with pytest.raises(ds.ConstraintViolation, match=match):
        exe.run({"x": x}, out={"y": bad})
    assert exe.stats_.calls == calls  # nothing ran
    if isinstance(bad, np.ndarray):
        assert not bad.any()  # nothing written
    with pytest.raises(ds.ConstraintViolation, match="not an output"):
        exe.run({"x": x}, out={"z": np.zeros((5, 64), np.float32)})
    readonly = np.zeros((5, 64), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ds.ConstraintViolation, match="writeable"):
        exe.run({"x": x}, out={"y": readonly})
    np.testing.assert_allclose(exe.run({"x": x})["y"], g.run({"x": x})["y"], rtol=1e-5, atol=1e-3)


def test_out_on_the_unplanned_path_and_for_an_empty_key():
    g = load_onnx(build_mlp())
    exe = ds.compile(g, planned=False)
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    buf = np.empty((3, 64), np.float32)
    assert exe.run({"x": x}, out={"y": buf})["y"] is buf
    np.testing.assert_array_equal(buf, exe.run({"x": x})["y"])
    with pytest.raises(ds.ConstraintViolation, match="float32\\[2, 64\\]"):
        exe.run({"x": x}, out={"y": np.empty((2, 64), np.float32)})
    empty = np.empty((0, 64), np.float32)
    assert ds.compile(g).run({"x": np.zeros((0, 64), np.float32)}, out={"y": empty})["y"] is empty
