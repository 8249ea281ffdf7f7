"""The op table's typed properties (`ir.opdef.OpDef`) that passes read instead of keeping lists of names.

Each pass used to keep its own set of op names (the layout's elementwise ops, the random ops, the views); an op
left out of one lost an optimisation silently. These tests pin what the sets held when the properties replaced
them (nothing may lose its property), and make a new elementwise op either sink under the channels-last layout
or be listed here on purpose.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dynshape as ds
import dynshape.ops  # noqa: F401
from dynshape.codegen.lowering import Unsupported
from dynshape.frontends.aten.emit import Emitter
from dynshape.frontends.onnx_export import to_onnx
from dynshape.ir import opdef
from dynshape.ir.graph import Node
from dynshape.ir.opdef import Layout, Movement, PoolKind

# The hand-kept sets as they stood when the op table took them over (passes/layout.py, passes/values.py,
# passes/hoist.py, ir/opdef.py's RANDOM_OPS and its copy in frontends/aten/emit.py).
FORMER = {
    "spatial": {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Resize",
                "Upsample", "LpPool", "GlobalLpPool", "LRN", "InstanceNormalization"},
    "layout elementwise": {
        "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu", "Where", "Relu", "Sigmoid", "Tanh",
        "Exp", "Log", "Abs", "Neg", "Sqrt", "Reciprocal", "Erf", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish",
        "Elu", "Selu", "Celu", "Softplus", "Softsign", "Mish", "Swish", "Gelu", "Identity", "Cast", "Floor", "Ceil",
        "Round", "Sign", "Not", "And", "Or", "Xor", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
        "IsNaN", "IsInf", "ThresholdedRelu", "Shrink", "Dropout"},
    "axis": {"Concat", "Split", "Softmax", "LogSoftmax"},
    "reduce": {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ReduceL2", "ReduceL1",
               "ReduceSumSquare", "ReduceLogSumExp"},
    "view": {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"},
    "movement": {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"},
    "arithmetic": {"Mul", "Div", "Add", "Sub"},
    "random": {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
               "Dropout"},
}
# parameters, not data, under a layout permutation: only input 0 is permuted
# and Split's sizes (an input from opset 13), which the former sets permuted as an operand, so that a Split with
# its sizes as an input never sank (YOLOv8's C2f blocks: 2.45 ms of a 12.4 ms call in layout transposes)
FORMER_PERMUTED_INPUTS = {"Clip": 1, "Split": 1, **{op: 1 for op in FORMER["reduce"]}}

# Elementwise ops the channels-last layout does not sink through (ops/elementwise.py's _LAYOUT_KEEPS_ORDER): the
# layout's list of names left them out. Adding one here is a decision (speed lost on channels-last graphs), so it
# is made in this file too; removing one is always exact.
KEEPS_ORDER = {"Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "BitwiseNot",
               "Mod", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "CastLike"}
NOT_ELEMENTWISE_IN_ELEMENTWISE_PY = {"BitCast", "SwiGLU"}  # reshape the last axis


# dynshape's own ops with properties, each for a reason given where it is defined (ops/dynquant_conv.py: the ops a
# dynamically quantized convolution becomes follow the activation into channels last)
DYNSHAPE_DOMAIN = {"DynamicQuantParams": (Layout.ORDER_FREE, False, None),
                   "QuantizeCentered": (Layout.ELEMENTWISE, True, 1),
                   "IntegerAdd": (Layout.ELEMENTWISE, True, None)}


def _default_domain() -> dict:
    return {key: op for key, op in opdef.OPS.items() if key[0] == opdef.DEFAULT_DOMAIN}


def _with(pred) -> set[str]:
    return {name for (_, name), op in _default_domain().items() if pred(op)}


def test_the_dynshape_domain_ops_with_properties_are_these():
    got = {name: (op.layout, op.elementwise, op.permuted_inputs) for (domain, name), op in opdef.OPS.items()
           if domain != opdef.DEFAULT_DOMAIN and (op.layout is not Layout.CHANNELS_FIRST or op.elementwise
                                                   or op.arithmetic or op.random or op.movement is not Movement.NONE)}
    assert got == DYNSHAPE_DOMAIN


DERIVED = {
    "spatial": lambda op: op.layout is Layout.SPATIAL,
    "layout elementwise": lambda op: op.layout is Layout.ELEMENTWISE,
    "axis": lambda op: op.layout is Layout.AXIS,
    "reduce": lambda op: op.layout is Layout.REDUCE,
    "view": lambda op: op.movement is Movement.VIEW,
    "movement": lambda op: op.movement is not Movement.NONE,
    "arithmetic": lambda op: op.arithmetic,
    "random": lambda op: op.random,
}


@pytest.mark.parametrize("prop", sorted(FORMER))
def test_no_op_lost_a_property_the_passes_gave_it_by_name(prop):
    assert FORMER[prop] <= _with(DERIVED[prop])


@pytest.mark.parametrize("prop", ["spatial", "axis", "reduce", "view", "movement", "arithmetic", "random"])
def test_the_closed_properties_hold_exactly_the_former_ops(prop):
    """Wrapping, axis permutation, views, the epilogue's arithmetic and randomness each change what a pass does
    with the op: an op gains one in a change of its own, with its test."""
    assert _with(DERIVED[prop]) == FORMER[prop]


def test_layout_permutes_the_data_inputs_it_did():
    got = {name: op.permuted_inputs for (_, name), op in _default_domain().items()
           if op.permuted_inputs is not None and op.layout is not Layout.CHANNELS_FIRST}
    assert got == FORMER_PERMUTED_INPUTS


def test_every_op_with_an_elementwise_rule_is_marked_elementwise():
    """An op defined in ops/elementwise.py (broadcasting or same-shape rule) says so: that is what the layout and
    the hoisting read."""
    defined_there = {name for (_, name), op in opdef.OPS.items()
                     if op.infer is not None and op.infer.__module__ == "dynshape.ops.elementwise"}
    assert len(defined_there) > 60
    unmarked = {n for n in defined_there - NOT_ELEMENTWISE_IN_ELEMENTWISE_PY if not opdef.lookup(n).elementwise}
    assert not unmarked


def test_an_elementwise_op_sinks_under_the_channels_last_layout_unless_listed():
    elementwise = _with(lambda op: op.elementwise)
    assert {n for n in elementwise if opdef.lookup(n).layout is not Layout.ELEMENTWISE} == KEEPS_ORDER
    assert FORMER["layout elementwise"] == elementwise - KEEPS_ORDER


def test_pools_name_their_kind():
    pools = {name: (op.pool, op.global_pool) for (_, name), op in opdef.OPS.items() if op.pool is not None}
    assert pools == {"MaxPool": (PoolKind.MAX, False), "AveragePool": (PoolKind.AVERAGE, False),
                     "LpPool": (PoolKind.LP, False), "GlobalMaxPool": (PoolKind.MAX, True),
                     "GlobalAveragePool": (PoolKind.AVERAGE, True), "GlobalLpPool": (PoolKind.LP, True)}
    assert all(opdef.lookup(n).layout is Layout.SPATIAL for n in pools)


def test_the_pool_kernel_has_a_case_for_every_kind():
    """Every kind either has the pool kernel's case or is refused as Unsupported (another lowering runs it):
    a kind added to PoolKind without a case fails here, never computes as an average."""
    from dynshape.codegen.lower import pool

    for kind in PoolKind:
        try:
            pool._check_kind(kind)
        except Unsupported:
            assert kind is PoolKind.LP


@pytest.mark.parametrize("op,attrs", [("LpPool", {"kernel_shape": [3, 3], "p": 3, "pads": [1, 1, 1, 1]}),
                                      ("GlobalLpPool", {"p": 2})])
def test_lp_pools_wrapped_channels_last_compute_lp_norms(op, attrs, monkeypatch):
    """Even offered to the pool kernel (as a new pool op would be), an Lp pool is not averaged."""
    from dynshape.passes import rules

    monkeypatch.setattr(rules, "_KERNEL_POOLS", frozenset(PoolKind))
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    graph = ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), dims={"n": (1, 2)})
    x = np.random.default_rng(0).standard_normal((2, 8, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(ds.compile(graph).run({"x": x})["y"], graph.run({"x": x})["y"], rtol=1e-5, atol=1e-6)


# ---- random ---------------------------------------------------------------------------------------------------
def test_random_ops_are_random_by_node_and_in_the_aten_emitter():
    assert opdef.is_random(Node("Dropout", "", "d", {}, ["x"], ["y"]))
    assert not opdef.is_random(Node("Relu", "", "r", {}, ["x"], ["y"]))
    em = Emitter()
    x = em.input("x", np.dtype(np.float32), (4,))
    a, b = em.node("RandomUniformLike", [x]), em.node("RandomUniformLike", [x])
    assert a != b  # two draws stay two nodes
    assert em.node("Relu", [x]) == em.node("Relu", [x])  # the same function of the same value: one node


# ---- the default domain -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["", "ai.onnx", "onnx"])
def test_every_spelling_of_the_default_domain_is_one_value(spelling):
    n = Node("Relu", spelling, "r", {}, ["x"], ["y"])
    assert n.domain == opdef.DEFAULT_DOMAIN and opdef.is_default_domain(n)
    assert opdef.canonical_domain(spelling) == opdef.DEFAULT_DOMAIN
    assert opdef.lookup("Relu", spelling) is opdef.lookup("Relu")
    assert not opdef.is_default_domain(Node("LabelEncoder", "ai.onnx.ml", "l", {}, ["x"], ["y"]))


def test_a_model_spelling_ai_onnx_imports_as_the_default_domain_and_exports_valid():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], domain="ai.onnx"),
                           helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0], domain="ai.onnx")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx", 18)])
    graph = ds.load_onnx(model)
    assert [n.domain for n in graph.nodes] == ["", ""]
    out = to_onnx(graph)
    onnx.checker.check_model(out)
    assert [n.domain for n in out.graph.node] == ["", ""]
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    np.testing.assert_array_equal(ds.compile(graph).run({"x": x})["y"], np.maximum(x, 0).T)
