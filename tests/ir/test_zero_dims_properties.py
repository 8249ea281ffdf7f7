"""Soundness with empty tensors: broadcasting over symbolic dims that may be 0 or 1, end to end.

Random Add/Mul/Where graphs whose input dims are small ints or named symbols (names shared between inputs, so
inference unifies them), loaded with the default range [0, inf], run on random assignments in 0..3. numpy is
the judge: where numpy broadcasts, dynshape must run and give numpy's result; where numpy refuses, dynshape must
refuse with a ConstraintViolation (never run on, never a ShapeError "bug" message). A model inference rejects
must be one numpy rejects for every assignment.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import dynshape as ds
from dynshape.frontends.onnx import load_onnx

NAMES = ("p", "q", "r")
DIM = st.one_of(st.sampled_from([0, 1, 2, 3]), st.sampled_from(NAMES))
SHAPE = st.lists(DIM, min_size=0, max_size=3)


def _model(op: str, shapes: list[list]) -> object:
    names = ["a", "b", "c"][: len(shapes)]
    elem = [TensorProto.BOOL if op == "Where" and i == 0 else TensorProto.FLOAT for i in range(len(shapes))]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"])], "t",
        [helper.make_tensor_value_info(n, e, s) for n, e, s in zip(names, elem, shapes)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _arrays(op: str, shapes: list[list], env: dict) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for i, s in enumerate(shapes):
        dims = [env[d] if isinstance(d, str) else d for d in s]
        out.append(rng.random(dims) > 0.5 if op == "Where" and i == 0 else rng.standard_normal(dims).astype(np.float32))
    return out


def _numpy(op: str, xs: list[np.ndarray]) -> np.ndarray | None:
    try:
        if op == "Where":
            return np.where(*xs)
        return xs[0] + xs[1] if op == "Add" else xs[0] * xs[1]
    except ValueError:
        return None


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(op=st.sampled_from(["Add", "Mul", "Where"]), shapes=st.lists(SHAPE, min_size=3, max_size=3))
def test_broadcast_with_zero_dims_is_sound_and_exact(op: str, shapes: list[list]) -> None:
    shapes = shapes[: 3 if op == "Where" else 2]
    used = sorted({d for s in shapes for d in s if isinstance(d, str)})
    envs = [dict(zip(used, vals)) for vals in itertools.product(range(4), repeat=len(used))]
    try:
        g = load_onnx(_model(op, shapes))
    except ds.ShapeError:
        for env in envs:  # inference refused: numpy must refuse every assignment
            assert _numpy(op, _arrays(op, shapes, env)) is None, (shapes, env)
        return
    for env in envs:
        xs = _arrays(op, shapes, env)
        want = _numpy(op, xs)
        feeds = dict(zip(["a", "b", "c"], xs))
        if want is None:
            try:
                g.run(feeds)
            except ds.ConstraintViolation:
                continue
            raise AssertionError(f"{op} {shapes} ran at {env}, which numpy refuses")
        got = g.run(feeds)["y"]
        assert got.shape == want.shape, (op, shapes, env, got.shape, want.shape)
        np.testing.assert_array_equal(got, want)
