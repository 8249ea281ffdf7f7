"""Shape/dtype rules and value propagation of the elementwise ops, through the real frontend + inference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from opgraph import infer

import dynshape as ds
import dynshape.ops  # noqa: F401  (registers every op)
from dynshape.ir.graph import Graph

ENV = {"batch": 3, "seq": 7, "n": 5}




def node(op: str, ins: list[str], outs: list[str], **attrs) -> object:
    return helper.make_node(op, ins, outs, **attrs)


def values(g: Graph, name: str) -> list | None:
    """A propagated value evaluated at ENV (None when unknown)."""
    v = g.types[name].value
    if v is None:
        return None
    return [e.evaluate(ENV) if ds.is_expr(e) else e.item() if hasattr(e, "item") else e for e in v.ravel()]


X = {"x": (TensorProto.FLOAT, ["batch", "seq"])}


def shape_then(op: str, const: object, **attrs) -> Graph:
    return infer([node("Shape", ["x"], ["s"]), node(op, ["s", "c"], ["y"], **attrs)], X,
                 {"c": np.asarray(const, np.int64)})


def test_mul_of_a_symbolic_shape_value() -> None:
    g = shape_then("Mul", [4])
    assert values(g, "y") == [4 * 3, 4 * 7]
    assert str(g.types["y"].value[1]) == "4*seq"


def test_integer_div_value_only_when_floor_equals_truncation() -> None:
    assert values(shape_then("Div", 2), "y") == [3 // 2, 7 // 2]
    assert shape_then("Div", -2).types["y"].value is None  # batch // -2 floors, ONNX truncates
    g = infer([node("Shape", ["x"], ["s"]), node("Sub", ["s", "ten"], ["d"]), node("Div", ["d", "two"], ["y"])],
              X, {"ten": np.array(10, np.int64), "two": np.array(2, np.int64)})
    assert values(g, "d") == [3 - 10, 7 - 10]
    assert g.types["y"].value is None  # seq - 10 may be negative


def test_equal_decides_only_what_is_provable() -> None:
    assert shape_then("Equal", [0, 0]).types["y"].value is None  # named dims are >= 0 by default
    g = infer([node("Shape", ["x"], ["s"]), node("Equal", ["s", "c"], ["y"])], X, {"c": np.zeros(2, np.int64)},
              default_min=1)
    assert values(g, "y") == [False, False]  # declared >= 1
    assert shape_then("Equal", [3, 7]).types["y"].value is None
    assert shape_then("Equal", [3, 7]).types["y"].dtype == np.bool_
    g = infer([node("Shape", ["x"], ["s"]), node("Equal", ["s", "s"], ["y"])], X)
    assert values(g, "y") == [True, True]


def test_where_picks_the_known_branch() -> None:
    g = infer([node("Shape", ["x"], ["s"]), node("Where", ["cond", "s", "minus1"], ["y"])], X,
              {"cond": np.array([False, True]), "minus1": np.array([-1, -1], np.int64)})
    assert values(g, "y") == [-1, 7]


def test_min_max_neg_sum_values() -> None:
    assert values(shape_then("Min", [16]), "y") == [3, 7]
    assert str(shape_then("Max", [16]).types["y"].value[0]) in ("max(16, batch)", "max(batch, 16)")
    # Sum takes floats only (onnxruntime and load_onnx refuse int64): the dims go through a Cast
    g = infer([node("Shape", ["x"], ["s"]), node("Neg", ["s"], ["y"]), node("Cast", ["s"], ["f"], to=TensorProto.FLOAT),
               node("Cast", ["y"], ["g"], to=TensorProto.FLOAT), node("Sum", ["f", "f", "g"], ["z"])], X)
    assert values(g, "y") == [-3, -7] and values(g, "z") == [3, 7]


@pytest.mark.parametrize(("to", "kept"), [(TensorProto.INT32, True), (TensorProto.FLOAT, True),
                                          (TensorProto.BOOL, False), (TensorProto.STRING, False)])
def test_cast_keeps_dim_values_between_numeric_types(to: int, kept: bool) -> None:
    g = infer([node("Shape", ["x"], ["s"]), node("Cast", ["s"], ["y"], to=to)], X)
    assert (values(g, "y") == [3, 7]) if kept else g.types["y"].value is None
    assert g.types["y"].dtype == (np.dtype(object) if to == TensorProto.STRING
                                  else helper.tensor_dtype_to_np_dtype(to))


def test_broadcast_shapes_and_dtypes() -> None:
    g = infer([node("Add", ["a", "b"], ["y"]), node("Less", ["a", "b"], ["m"])],
              {"a": (TensorProto.FLOAT, ["batch", 1, 8]), "b": (TensorProto.FLOAT, ["seq", 8])})
    y = g.types["y"]
    assert y.dtype == np.float32 and tuple(d if isinstance(d, int) else d.evaluate(ENV) for d in y.shape) == (3, 7, 8)
    assert g.types["m"].dtype == np.bool_


def test_mixed_dtypes_are_a_named_error() -> None:
    with pytest.raises(ds.ShapeError, match="Cast"):
        infer([node("Add", ["a", "b"], ["y"])], {"a": (TensorProto.FLOAT, [2]), "b": (TensorProto.INT32, [2])})


def test_incompatible_static_dims_are_an_error() -> None:
    with pytest.raises(ds.ShapeError):
        infer([node("Mul", ["a", "b"], ["y"])], {"a": (TensorProto.FLOAT, [2, 3]), "b": (TensorProto.FLOAT, [4])})


def test_legacy_axis_broadcast() -> None:
    g = infer([node("Add", ["a", "b"], ["y"], broadcast=1, axis=1)],
              {"a": (TensorProto.FLOAT, [2, 3, 4]), "b": (TensorProto.FLOAT, [3])}, opset=6)
    assert g.types["y"].shape == (2, 3, 4)


def test_unary_dropout_prelu_clip_rules() -> None:
    g = infer([node("Relu", ["x"], ["r"]), node("Dropout", ["x"], ["d", "mask"]),
               node("PRelu", ["x", "slope"], ["p"]), node("Clip", ["x", "", "hi"], ["c"]),
               node("IsNaN", ["x"], ["nan"])],
              X, {"slope": np.ones([1], np.float32), "hi": np.array(1, np.float32)})
    for name in ("r", "d", "p", "c"):
        assert g.types[name].dtype == np.float32 and [str(d) for d in g.types[name].shape] == ["batch", "seq"]
    assert g.types["mask"].dtype == np.bool_ and g.types["nan"].dtype == np.bool_


def test_castlike_takes_target_dtype() -> None:
    g = infer([node("CastLike", ["x", "t"], ["y"])], X, {"t": np.zeros(1, np.float16)})
    assert g.types["y"].dtype == np.float16
