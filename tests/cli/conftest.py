"""Small ONNX models for the CLI tests, built with onnx.helper into a temporary directory (nothing downloaded)."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def save(tmp: Path, name: str, nodes: list, inputs: list, outputs: list, inits: list | None = None,
         opsets: list | None = None) -> Path:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits or [])
    model = helper.make_model(graph, opset_imports=opsets or [helper.make_opsetid("", 18)])
    model.ir_version = 8
    path = tmp / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("models")
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    out: dict[str, Path] = {}
    # y = relu(x @ W + B), x: (batch, 4)
    out["mlp"] = save(
        tmp, "mlp",
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        [helper.make_tensor_value_info("x", f32, ["batch", 4])],
        [helper.make_tensor_value_info("y", f32, ["batch", 3])],
        [numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5, "W"),
         numpy_helper.from_array(np.array([0.1, -0.2, 0.3], np.float32), "B")])
    # token ids into a 50-row table, plus a mask: (batch, seq) -> (batch, seq, 2)
    table = np.arange(100, dtype=np.float32).reshape(50, 2)
    out["tokens"] = save(
        tmp, "tokens",
        [helper.make_node("Gather", ["table", "input_ids"], ["e"], axis=0),
         helper.make_node("Cast", ["attention_mask"], ["m"], to=f32),
         helper.make_node("Unsqueeze", ["m", "ax"], ["m3"]),
         helper.make_node("Mul", ["e", "m3"], ["y"])],
        [helper.make_tensor_value_info("input_ids", i64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", i64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", f32, ["batch", "seq", 2])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array([2], np.int64), "ax")])
    # reshapes n elements to a constant (4, 25): only n == 100 is admissible
    out["reshape"] = save(
        tmp, "reshape",
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [helper.make_tensor_value_info("x", f32, ["n"])],
        [helper.make_tensor_value_info("y", f32, [4, 25])],
        [numpy_helper.from_array(np.array([4, 25], np.int64), "shape")])
    # an op no backend will ever have
    out["unsupported"] = save(
        tmp, "unsupported",
        [helper.make_node("Frobnicate", ["x"], ["h"], domain="com.example"), helper.make_node("Relu", ["h"], ["y"])],
        [helper.make_tensor_value_info("x", f32, ["batch", 4])],
        [helper.make_tensor_value_info("y", f32, ["batch", 4])],
        opsets=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)])
    (tmp / "garbage.onnx").write_bytes(b"this is not protobuf \x00\xff" * 10)
    out["garbage"] = tmp / "garbage.onnx"
    return out
