"""Shape rules of MatMul/Gemm/Einsum and the normalizations over symbolic dims (real inference engine)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from opgraph import infer

import dynshape as ds
import dynshape.ops  # noqa: F401  (registers every op)
from dynshape.ir.graph import Graph

F = TensorProto.FLOAT
ENV = {"b": 2, "s": 9, "h": 4, "o": 6, "k": 4}




def dims(g: Graph, name: str) -> tuple:
    return tuple(d.evaluate(ENV) if ds.is_expr(d) else d for d in g.types[name].shape)


@pytest.mark.parametrize(("a", "b", "out"), [
    (["b", "s", "h"], ["h", "o"], (2, 9, 6)),
    (["h"], ["b", "h", "o"], (2, 6)),
    (["b", "s", "h"], ["h"], (2, 9)),
    (["h"], ["h"], ()),
    ([1, "s", "h"], ["b", 1, "h", "o"], (2, 1, 9, 6)),
    (["s", 1, "h", "h"], ["b", "h", "o"], (9, 2, 4, 6)),
])
def test_matmul_shapes(a: list, b: list, out: tuple) -> None:
    g = infer([helper.make_node("MatMul", ["a", "b_"], ["y"])], {"a": (F, a), "b_": (F, b)})
    assert dims(g, "y") == out


def test_matmul_unifies_inner_dims_and_rejects_static_mismatch() -> None:
    g = infer([helper.make_node("MatMul", ["a", "b_"], ["y"])], {"a": (F, ["s", "h"]), "b_": (F, ["k", "o"])})
    inner = {str(d) for d in g.types["a"].shape[1:]} | {str(d) for d in g.types["b_"].shape[:1]}
    assert len(inner) == 1  # h and k became one symbol
    with pytest.raises(ds.ShapeError, match="MatMul"):
        infer([helper.make_node("MatMul", ["a", "b_"], ["y"])], {"a": (F, ["s", 3]), "b_": (F, [4, "o"])})


def test_gemm_transposes_and_bias() -> None:
    g = infer([helper.make_node("Gemm", ["a", "b_", "c"], ["y"], transA=1, transB=1)],
              {"a": (F, ["h", "s"]), "b_": (F, ["o", "h"]), "c": (F, ["o"])})
    assert dims(g, "y") == (9, 6)


@pytest.mark.parametrize(("eq", "shapes", "out"), [
    ("bij,bjk->bik", [["b", "s", "h"], ["b", "h", "o"]], (2, 9, 6)),
    ("ij,jk", [["s", "h"], ["h", "o"]], (9, 6)),
    ("...ij,...jk->...ik", [["b", "s", "h"], ["h", "o"]], (2, 9, 6)),
    ("ii->i", [["s", "s"]], (9,)),
    ("ij->", [["s", "h"]], ()),
    ("ji", [["s", "h"]], (4, 9)),
])
def test_einsum_shapes(eq: str, shapes: list, out: tuple) -> None:
    names = [f"x{i}" for i in range(len(shapes))]
    g = infer([helper.make_node("Einsum", names, ["y"], equation=eq)], {n: (F, s) for n, s in zip(names, shapes)})
    assert dims(g, "y") == out


def test_einsum_rejects_wrong_rank() -> None:
    with pytest.raises(ds.ShapeError, match="rank"):
        infer([helper.make_node("Einsum", ["x"], ["y"], equation="ijk->i")], {"x": (F, ["s", "h"])})


def test_layer_norm_statistics_shapes() -> None:
    g = infer([helper.make_node("LayerNormalization", ["x", "w", "bias"], ["y", "mean", "inv"], axis=-1)],
              {"x": (F, ["b", "s", 4])}, {"w": np.ones(4, np.float32), "bias": np.zeros(4, np.float32)})
    assert dims(g, "y") == (2, 9, 4) and dims(g, "mean") == (2, 9, 1) and g.types["inv"].dtype == np.float32


def test_batchnorm_unifies_channels() -> None:
    p = (F, ["c"])
    g = infer([helper.make_node("BatchNormalization", ["x", "sc", "bi", "m", "v"], ["y"])],
              {"x": (F, ["b", 3, "s"]), "sc": p, "bi": p, "m": p, "v": p})
    assert dims(g, "y") == (2, 3, 9) and g.types["sc"].shape == (3,)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax", "MeanVarianceNormalization"])
def test_shape_preserving_ops(op: str) -> None:
    g = infer([helper.make_node(op, ["x"], ["y"])], {"x": (F, ["b", "s", "h", "o"])})
    assert dims(g, "y") == (2, 9, 4, 6)


def test_matmul_integer_is_int32() -> None:
    g = infer([helper.make_node("MatMulInteger", ["a", "b_"], ["y"])],
              {"a": (TensorProto.UINT8, ["s", "h"]), "b_": (TensorProto.UINT8, ["h", "o"])})
    assert g.types["y"].dtype == np.int32 and dims(g, "y") == (9, 6)
