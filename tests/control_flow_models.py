"""Building blocks of the control-flow tests' ONNX models (If / Loop / Scan graphs written by hand), shared by
tests/ir/test_control_flow.py and tests/runtime/test_loop_bodies.py. Imported by name: tests/ has no packages."""

from __future__ import annotations

from onnx import TensorProto, helper

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def vi(name: str, elem: int, shape: list | None) -> object:
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes: list, inputs: list, outputs: list, inits: list = (), name: str = "cf") -> object:
    """Opset 18, IR 8: what onnxruntime and onnx's ReferenceEvaluator both run."""
    m = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def grow_body() -> object:
    """A Loop body whose carried value grows each iteration (Concat with the outer x), an accumulator (acc + x)
    and a scan output (acc * x): a carried dim that changes per iteration, an outer read, a scan output."""
    return helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Concat", ["grow_in", "x"], ["grow_out"], axis=0),
         helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("Mul", ["acc_out", "x"], ["scan_out"])],
        "body", [vi("i", I64, []), vi("cond_in", BOOL, []), vi("grow_in", F32, None), vi("acc_in", F32, None)],
        [vi("cond_out", BOOL, []), vi("grow_out", F32, None), vi("acc_out", F32, None),
         vi("scan_out", F32, None)])
