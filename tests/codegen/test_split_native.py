"""Split's native lowering (codegen/lower/movement.py): every opset's way of giving the sizes (attribute, input,
equal parts, opset 18's num_outputs), bound as one strided copy per output, exact against the reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynshape as ds
from dynshape.codegen.lower import movement
from dynshape.ir.opdef import lookup

RNG = np.random.default_rng(5)


def _model(opset: int, n_out: int, axis: int, split: list[int] | None, attrs: dict, dtype=TensorProto.FLOAT):
    ins, inits = ["x"], []
    if split is not None and opset >= 13:
        ins.append("split")
        inits.append(numpy_helper.from_array(np.array(split, np.int64), "split"))
    elif split is not None:
        attrs = {**attrs, "split": split}
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node("Split", ins, outs, axis=axis, **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", dtype, ["a", "b", "c"])],
                          [helper.make_tensor_value_info(o, dtype, None) for o in outs], inits)
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


CASES = [  # opset, outputs, axis, split, attrs, input shape
    (11, 3, -1, [4, 8, 4], {}, (2, 3, 16)),
    (13, 3, 2, [5, 1, 6], {}, (2, 3, 12)),
    (13, 2, 1, None, {}, (3, 6, 5)),  # equal parts
    (13, 3, 0, [0, 2, 1], {}, (3, 2, 2)),  # an empty piece
    (18, 3, 1, None, {"num_outputs": 3}, (2, 7, 3)),  # ceil(7 / 3) = 3: pieces 3, 3, 1
    (18, 2, -1, [3, 9], {}, (4, 1, 12)),
]


@pytest.mark.parametrize("opset,n_out,axis,split,attrs,shape", CASES)
def test_split_is_native_and_matches_the_reference(monkeypatch, opset, n_out, axis, split, attrs, shape):
    copies = []

    def spy(src, out, keep):
        copies.append(src.shape)
        return copy(src, out, keep)

    copy = movement._copy
    monkeypatch.setattr(movement, "_copy", spy)
    g = _model(opset, n_out, axis, split, attrs)
    exe = ds.compile(g)
    assert [s.how for s in exe.generic.steps] == ["native"], exe.explain_build()["uncompiled"]
    x = RNG.standard_normal(shape).astype(np.float32)
    got = exe.run({"x": x})
    sizes = [np.array(split, np.int64)] if split is not None and opset >= 13 else []
    a = {"axis": axis, **attrs, **({"split": split} if split is not None and opset < 13 else {}), "_opset": opset,
         "_num_outputs": n_out}
    want = lookup("Split").reference([x, *sizes], a)
    assert len(want) == n_out
    for k, w in enumerate(want):
        assert got[f"y{k}"].shape == w.shape
        np.testing.assert_array_equal(got[f"y{k}"], w)
    assert len(copies) == n_out  # bound natively: no fallback to the reference at run time


def test_an_int64_split_over_new_shapes():
    g = _model(13, 2, 1, None, {}, dtype=TensorProto.INT64)
    exe = ds.compile(g)
    for shape in [(1, 4, 3), (2, 10, 1), (3, 2, 5)]:
        x = RNG.integers(-2**62, 2**62, shape)
        got = exe.run({"x": x})
        for k, w in enumerate(np.split(x, 2, axis=1)):
            np.testing.assert_array_equal(got[f"y{k}"], w)
