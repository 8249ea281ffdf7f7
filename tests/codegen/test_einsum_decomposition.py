"""Einsum written out as Transposes, Reshapes, a MatMul (and a ReduceSum for a label one operand alone drops):
passes/einsum.py. Every equation against numpy's einsum in float64 at two sets of sizes (the labels' dims symbolic,
so the regrouping reshapes hold at any size), with the Einsum gone from the compiled build where it is written
out, and kept (still right) where it is not: an ellipsis, a diagonal, an implicit output."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynshape as ds
from tolerance import assert_f32_close

RNG = np.random.default_rng(31)
SIZES = [{"a": 2, "b": 3, "c": 4, "d": 5, "h": 6, "i": 7, "j": 3, "k": 5, "n": 2},
         {"a": 1, "b": 4, "c": 2, "d": 3, "h": 8, "i": 1, "j": 6, "k": 2, "n": 3}]

WRITTEN_OUT = [
    "ij,jk->ik", "bij,bjk->bik", "bhqd,bhkd->bhqk".replace("q", "i").replace("k", "j"), "ij->ji", "ij->i",
    "ijk,k->ij", "i,i->", "i,j->ij", "bi,bj->bij", "abc,cd->abd", "ab,cb->ac", "abc,bd->ad",
    # XLNet's relative attention
    "ibh,hnd->ibnd", "ibnd,hnd->ibh", "ibnd,jbnd->bnij", "bnij,jbnd->ibnd", "ijbn->bnij",
]
KEPT = ["ii->i", "ij,jk", "...ij,...jk->...ik"]


def _model(eq: str, const_second: bool = False):
    lhs = eq.split("->")[0]
    terms = lhs.split(",")
    ins, inits = [], []
    for k, term in enumerate(terms):
        name = f"x{k}"
        if "." in term:
            dims = ["e0", *[f"d_{c}" for c in term.replace("...", "")]]
        else:
            dims = [f"d_{c}" for c in term]
        if const_second and k == 1:
            shape = [SIZES[0][c] for c in term]
            inits.append(helper.make_tensor(name, TensorProto.FLOAT, shape,
                                            RNG.standard_normal(shape).astype(np.float32).ravel().tolist()))
        else:
            ins.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
    node = helper.make_node("Einsum", [f"x{k}" for k in range(len(terms))], ["y"], equation=eq)
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return ds.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def _feed(eq: str, sizes: dict) -> dict:
    terms = eq.split("->")[0].split(",")
    out = {}
    for k, term in enumerate(terms):
        shape = ([2] if "..." in term else []) + [sizes[c] for c in term.replace("...", "")]
        out[f"x{k}"] = RNG.standard_normal(shape).astype(np.float32)
    return out


def _einsum_steps(exe) -> int:
    return sum(1 for s in exe.generic.steps if getattr(getattr(s, "node", None), "op_type", "") == "Einsum")


@pytest.mark.parametrize("eq", WRITTEN_OUT)
def test_an_einsum_is_written_out_and_exact(eq):
    g = _model(eq)
    exe = ds.compile(g)
    assert _einsum_steps(exe) == 0, exe.explain_build()["uncompiled"]
    # (the regrouping's targets, symbolic ones included, are values of the key: nothing runs per call for them)
    assert not [u for u in exe.explain_build()["uncompiled"] if u["when"] == "every call"]
    for sizes in SIZES:
        feed = _feed(eq, sizes)
        want = np.einsum(eq, *[feed[f"x{k}"].astype(np.float64) for k in range(len(feed))])
        got = exe.run(feed)["y"]
        assert got.shape == want.shape
        assert_f32_close(got, want.astype(np.float32), rtol=1e-5, scale=1e-5 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("eq", ["ibh,hnd->ibnd", "ibnd,hnd->ibh", "abc,cd->abd"])
def test_a_constant_operand_becomes_a_product_by_packed_weights(eq):
    """XLNet's projections: the weight regrouped at compile time (folded), the product a compiled kernel."""
    g = _model(eq, const_second=True)
    exe = ds.compile(g)
    assert _einsum_steps(exe) == 0
    assert not [u for u in exe.explain_build()["uncompiled"] if u["when"] == "every call"]
    feed = _feed(eq.split(",")[0] + "->", SIZES[0])
    w = next(iter(g.initializers.values()))
    want = np.einsum(eq, feed["x0"].astype(np.float64), w.astype(np.float64))
    assert_f32_close(exe.run(feed)["y"], want.astype(np.float32), rtol=1e-5, scale=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("eq", KEPT)
def test_what_is_not_written_out_stays_an_einsum(eq):
    g = _model(eq)
    exe = ds.compile(g)
    assert _einsum_steps(exe) == 1
    feed = _feed(eq if "->" in eq else eq + "->ik", SIZES[0])
    want = np.einsum(eq, *[feed[f"x{k}"].astype(np.float64) for k in range(len(feed))])
    assert_f32_close(exe.run(feed)["y"], want.astype(np.float32), rtol=1e-5, scale=1e-5 * float(np.abs(want).max()))
