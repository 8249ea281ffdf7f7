"""Window attention's reshapes (Swin's window partition and reverse): the -1 of the reverse is the batch symbol,
not a data-dependent dim, though its divisor (the windows per image, a product of floor divisions) may be 0. The
generic graph assumes it is not (such inputs leave the -1 undefined, which numpy and onnxruntime refuse)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx


def _window_model():
    """x (B, H, W, 8) -> 7 x 7 windows (B * H//7 * W//7, 7, 7, 8) -> Relu -> back to (B, H//7, W//7, 7, 7, 8) with
    a -1 batch, as HF Swin's window_partition / window_reverse write them (shapes from Shape -> Gather -> Div)."""
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["sh"]),
             *[n("Gather", ["sh", f"i{k}"], [d]) for k, d in enumerate("bhwc")],
             n("Div", ["h", "seven"], ["h7"]), n("Div", ["w", "seven"], ["w7"]),
             n("Concat", ["b", "h7", "seven", "w7", "seven", "c"], ["t1"], axis=0),
             n("Reshape", ["x", "t1"], ["x6"]), n("Transpose", ["x6"], ["x6t"], perm=[0, 1, 3, 2, 4, 5]),
             n("Concat", ["m1", "seven", "seven", "c"], ["t2"], axis=0), n("Reshape", ["x6t", "t2"], ["win"]),
             n("Relu", ["win"], ["act"]),
             n("Concat", ["m1", "h7", "w7", "seven", "seven", "c"], ["t3"], axis=0),
             n("Reshape", ["act", "t3"], ["r6"], name="reverse"),
             n("Transpose", ["r6"], ["y"], perm=[0, 1, 3, 2, 4, 5])]
    inits = {**{f"i{k}": [k] for k in range(4)}, "seven": [7], "m1": [-1]}
    g = helper.make_graph(nodes, "windows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "H", "W", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _numpy(x: np.ndarray) -> np.ndarray:
    b, h, w, c = x.shape
    win = np.maximum(x.reshape(b, h // 7, 7, w // 7, 7, c).transpose(0, 1, 3, 2, 4, 5).reshape(-1, 7, 7, c), 0)
    return win.reshape(-1, h // 7, w // 7, 7, 7, c).transpose(0, 1, 3, 2, 4, 5)


def test_the_window_reverses_minus_one_is_the_batch():
    g = load_onnx(_window_model())
    assert str(g.types["r6"].shape[0]) == "B", g.types["r6"].shape  # (a fresh '?' dim before)
    assert any(f.kind == "assume" and "reverse" in f.origin for f in g.signature.facts)
    exe = ds.compile(g)
    rng = np.random.default_rng(0)
    for shape in ((1, 7, 7, 8), (2, 14, 21, 8), (3, 28, 7, 8)):
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(exe.run({"x": x})["y"], _numpy(x))
    bad = rng.standard_normal((1, 15, 14, 8)).astype(np.float32)  # not whole windows: numpy refuses it too
    with pytest.raises(ValueError):
        _numpy(bad)
    with pytest.raises(ds.DynshapeError):
        exe.run({"x": bad})


def _padded_window_model(negated: bool = False):
    """Swin's way: pad H and W up to whole 7 x 7 windows by (7 - H % 7) % 7 rows / columns, partition, Relu, reverse
    with -1 batches, crop back: every size symbolic (the -1s are B only if the padded sizes are known multiples of
    7, which the canonical form of the padding shows)."""
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["sh"]), *[n("Gather", ["sh", f"i{k}"], [d]) for k, d in enumerate("bhwc")],
             *[n(op, ins, [out]) for op, ins, out in (
                 ("Mod", ["h", "seven"], "hm"), *_minus("seven", "hm", "hn", negated), ("Mod", ["hn", "seven"], "ph"),
                 ("Mod", ["w", "seven"], "wm"), *_minus("seven", "wm", "wn", negated),
                 ("Mod", ["wn", "seven"], "pw"))],
             n("Concat", ["z4", "z1", "ph", "pw", "z1"], ["pads"], axis=0), n("Pad", ["x", "pads"], ["xp"]),
             n("Shape", ["xp"], ["shp"]), n("Gather", ["shp", "i1"], ["hp"]), n("Gather", ["shp", "i2"], ["wp"]),
             n("Div", ["hp", "seven"], ["h7"]), n("Div", ["wp", "seven"], ["w7"]),
             n("Concat", ["b", "h7", "seven", "w7", "seven", "c"], ["t1"], axis=0),
             n("Reshape", ["xp", "t1"], ["x6"]), n("Transpose", ["x6"], ["x6t"], perm=[0, 1, 3, 2, 4, 5]),
             n("Concat", ["m1", "seven", "seven", "c"], ["t2"], axis=0), n("Reshape", ["x6t", "t2"], ["win"]),
             n("Relu", ["win"], ["act"]), n("Concat", ["m1", "h7", "w7", "seven", "seven", "c"], ["t3"], axis=0),
             n("Reshape", ["act", "t3"], ["r6"]), n("Transpose", ["r6"], ["r6t"], perm=[0, 1, 3, 2, 4, 5]),
             n("Concat", ["m1", "hp", "wp", "c"], ["t4"], axis=0), n("Reshape", ["r6t", "t4"], ["full"]),
             n("Concat", ["h", "w"], ["ends"], axis=0), n("Slice", ["full", "z2", "ends", "axes12"], ["y"])]
    inits = {**{f"i{k}": [k] for k in range(4)}, "seven": [7], "m1": [-1], "z4": [0, 0, 0, 0], "z1": [0],
             "z2": [0, 0], "axes12": [1, 2]}
    g = helper.make_graph(nodes, "padded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "H", "W", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _minus(c: str, x: str, out: str, negated: bool) -> list:
    """c - x (HF Swin's Python), or -x as Neg (torch's `-x % c`: a dividend that may be negative)."""
    return [("Neg", [x], out)] if negated else [("Sub", [c, x], out)]


@pytest.mark.parametrize("negated", [False, True])
def test_windows_of_a_padded_map_keep_every_size_symbolic(negated):
    """Before, the reverse's -1s were fresh data-dependent dims and the reshapes after them ran on numpy; now they
    are the batch symbol, nothing is data-dependent, and the answers are numpy's for sizes that pad and do not."""
    g = load_onnx(_padded_window_model(negated))
    assert str(g.types["r6"].shape[0]) == "B" and str(g.types["full"].shape[0]) == "B", g.types["full"].shape
    assert not [k for k, t in g.types.items() if "?" in str(getattr(t, "shape", ""))]
    exe = ds.compile(g)
    rng = np.random.default_rng(1)
    for shape in ((1, 7, 7, 8), (2, 9, 15, 8), (1, 14, 3, 8), (3, 1, 1, 8)):
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(exe.run({"x": x})["y"], np.maximum(x, 0))
