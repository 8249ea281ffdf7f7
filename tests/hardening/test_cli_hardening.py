"""Issue 15, defect 5: the CLI checks shapes, bounds and memory against the signature before generating any data,
prints one line (exit 1), and `bench` without --shapes/--stream picks shapes spread over the declared ranges."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from dynshape.cli.main import app

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    """ids (batch, seq) into a 50-row table, scores (batch, seq, seq): a model whose memory grows with seq^2."""
    tmp = tmp_path_factory.mktemp("cli")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
             helper.make_node("Transpose", ["e"], ["et"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["e", "et"], ["y"])]
    g = helper.make_graph(nodes, "tokens", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", "seq"])],
                          [numpy_helper.from_array(np.ones((50, 4), np.float32), "table")])
    path = tmp / "tokens.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def _one_line_error(r, pattern: str) -> str:
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    err = flat(r.stderr)
    assert re.search(pattern, err), err
    return err


def test_huge_shape_is_refused_before_any_data_is_generated(tokens):
    t0 = time.perf_counter()
    r = invoke("run", tokens, "--shape", "1x1000000000")
    _one_line_error(r, r"at batch=1, seq=1000000000, node .*MatMul.* alone needs .* more than this machine's")
    assert time.perf_counter() - t0 < 30  # nothing of gigabytes was drawn


def test_shape_outside_a_declared_range_is_refused_before_generating(tokens):
    r = invoke("run", tokens, "--dim", "seq=1:64", "--shape", "1x100000000")
    _one_line_error(r, r"^ConstraintViolation: .*seq = 100000000 is outside its range \[1, 64\]")


def test_random_shape_is_checked_against_the_signature_first(tokens):
    r = invoke("run", tokens, "--random", "ids=2,3,4")
    _one_line_error(r, r"input 'ids' has rank 3")


def test_fractional_bounds_on_an_int_input_are_one_line(tokens):
    r = invoke("run", tokens, "--random", "ids=2,16:0.5:0.7")
    _one_line_error(r, r"input 'ids' is int64, so LOW and HIGH must be integers \(got 0.5:0.7\)")


def test_bounds_outside_the_int_dtype_are_one_line(tmp_path):
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.INT8, ["n"])],
                          [helper.make_tensor_value_info("y", TensorProto.INT8, ["n"])])
    path = tmp_path / "i8.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    _one_line_error(invoke("run", path, "--random", "x=4:0:1000"), r"does not fit int8")


def test_bench_without_shapes_or_stream_picks_shapes_over_the_declared_ranges(tokens):
    r = invoke("bench", tokens, "--dim", "batch=1:4", "--dim", "seq=2:32", "--vs", "", "-n", "1")
    assert r.exit_code == 0, r.output
    out = flat(r.stdout)
    assert "no --shapes or --stream given: timing 3 shape(s)" in out
    rows = [ln.split("|")[1].strip() for ln in r.stdout.splitlines() if ln.startswith("|")][2:]
    assert rows == ["1x2", "2x8", "4x32", "total timed"]
