
"""`dynshape compile`, `run` on an artefact, and `dynshape explain`, end to end through typer's CliRunner."""

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from dynshape.cli.main import app
from dynshape.models.encoder import build_encoder

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def mlp_artefact(models, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("art") / "mlp.ds"
    r = invoke("compile", models["mlp"], "--dim", "batch=1:8", "--specialize", "batch=2", "-o", out)
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("cmd", ["compile", "explain"])
def test_help_shows_examples(cmd):
    r = invoke(cmd, "--help")
    assert r.exit_code == 0 and "Examples" in r.stdout and f"dynshape {cmd} " in r.stdout


def test_compile_writes_an_artefact_and_summarises(models, tmp_path):
    out = tmp_path / "mlp.ds"
    r = invoke("compile", models["mlp"], "--dim", "batch=1:8", "--specialize", "batch=2", "--specialize", "batch=4",
               "-o", out)
    assert r.exit_code == 0, r.output
    text = flat(r.stdout)
    assert "symbols batch in [1, 8]" in text
    assert re.search(r"kernels 1 fused C kernel\(s\) in \d+ librar", text), text  # + the helper libraries
    assert "variants generic; batch=2; batch=4" in text
    assert "steps 1 (from 3 nodes)" in text  # MatMul with its Add+Relu epilogue: one kernel
    assert (out / "manifest.json").is_file() and list((out / "libs").rglob("*.so"))


@pytest.mark.parametrize("batch", [2, 5])
def test_run_from_the_artefact_equals_running_the_model(models, mlp_artefact, tmp_path, batch):
    a, b = tmp_path / "from-artefact", tmp_path / "from-onnx"
    r = invoke("run", mlp_artefact, "--shape", batch, "--seed", 3, "-o", a)
    assert r.exit_code == 0, r.output
    assert f"executor: dynshape (artefact {mlp_artefact})" in flat(r.stdout)
    r = invoke("run", models["mlp"], "--dim", "batch=1:8", "--shape", batch, "--seed", 3, "-o", b)
    assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(np.load(a / "y.npy"), np.load(b / "y.npy"))
    assert np.load(a / "y.npy").shape == (batch, 3)


def test_run_from_the_artefact_enforces_its_dims(mlp_artefact):
    r = invoke("run", mlp_artefact, "--random", "x=9,4")
    assert r.exit_code == 1
    assert "batch" in flat(r.stderr) and "Traceback" not in r.output


@pytest.mark.parametrize("args, message", [
    (["run", "{art}", "--dim", "batch=1:4", "--shape", "2"], "is an artefact"),
    (["explain", "{art}", "--specialize", "batch=1"], "is an artefact"),
    (["compile", "{mlp}", "--specialize", "batch", "-o", "{tmp}/x"], "expected NAME=VALUE pairs"),
    (["compile", "{mlp}", "--specialize", "batch=1,batch=2", "-o", "{tmp}/x"], "given twice"),
    (["compile", "{mlp}"], "Missing option '--out'"),
])
def test_bad_invocations_exit_2(models, mlp_artefact, tmp_path, args, message):
    r = invoke(*[a.format(art=mlp_artefact, mlp=models["mlp"], tmp=tmp_path) for a in args])
    assert r.exit_code == 2, r.output
    assert message in flat(r.stderr)


def test_compile_errors_exit_1(models, tmp_path):
    r = invoke("compile", models["mlp"], "--specialize", "batch=1,seq=4", "-o", tmp_path / "x")
    assert r.exit_code == 1 and "no symbol ['seq']" in flat(r.stderr)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    r = invoke("compile", models["mlp"], "-o", tmp_path / "busy")
    assert r.exit_code == 1 and "refusing to overwrite" in flat(r.stderr)


def test_a_tampered_artefact_is_refused(mlp_artefact, tmp_path):
    import shutil

    art = tmp_path / "art"
    shutil.copytree(mlp_artefact, art)
    (art / "model.onnx").write_bytes((art / "model.onnx").read_bytes() + b"\0")
    r = invoke("run", art, "--shape", "2")
    assert r.exit_code == 1
    assert "model.onnx does not match its sha256" in flat(r.stderr) and "Traceback" not in r.output


def test_explain_an_artefact(mlp_artefact):
    r = invoke("explain", mlp_artefact)
    assert r.exit_code == 0, r.output
    text = flat(r.stdout)
    assert "batch=2: 1 steps (declared by `dynshape compile --specialize`" in text
    assert "batch = x.shape[0] (x axis 0 is batch)" in text
    assert "input: x: dtype float32, rank 2" in text and "static: x.shape[1] == 4" in text
    assert "range: 1 <= batch <= 8" in text
    assert "kernel 1: MatMul " in text and "-> Relu " in text
    assert "other steps" not in text  # the product runs in the kernel, not through numpy/BLAS
    assert "worst-case memory 284 B" in text  # floats at the MatMul: x (8x4), h (8x3), W (4x3), B (3)
    # how keys are served with plans (runtime/key_states.py), with the default caps
    assert "called 4 times in a row or recalled 64 times binds its own plan; per arena at most 256 plans, 2048 " \
        "states and 64 MiB of per-key values between them; a full memory takes a new state only in place of one " \
        "unused for 4x the states held calls" in text


def test_explain_json_cross_input_guards(models):
    r = invoke("explain", models["tokens"], "--dim", "batch=1:4", "--dim", "seq=1:64", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [(s["name"], s["bound_from"]["input"], s["bound_from"]["axis"]) for s in data["symbols"]] == [
        ("batch", "input_ids", 0), ("seq", "input_ids", 1)]
    guards = {(g["kind"], g["text"]) for g in data["guards"]}
    assert ("equality", "attention_mask.shape[0] == batch") in guards
    assert ("equality", "attention_mask.shape[1] == seq") in guards
    assert [v["values"] for v in data["variants"]] == [None]
    assert "def bind(feed)" in data["binder_source"]
    assert data["memory"]["bytes"] is not None


def test_explain_shows_residual_facts_and_unbounded_memory(tmp_path):
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], "flatten4",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([-1, 4], np.int64), "shape")])
    path = tmp_path / "flatten4.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    r = invoke("explain", path, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    facts = [g for g in data["guards"] if g["kind"] == "fact"]
    assert [(f["text"], f["origin"]) for f in facts] == [("4 divides b*n", "node 'reshape' (Reshape)")]
    assert data["memory"]["bytes"] is None and set(data["memory"]["unbounded"]) == {"b", "n"}
    assert data["kernels"] == []


def test_explain_lists_assumptions_apart_from_refusing_facts(tmp_path):
    """A size held in float16 is exact only to 2048: assumed (larger keys run on an exact-shape build), never a
    fact that refuses the call."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["f"], ["i"], to=TensorProto.INT64),
             helper.make_node("ConstantOfShape", ["i"], ["y"])]
    graph = helper.make_graph(nodes, "half_size", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "half_size.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    r = invoke("explain", path, "--json")
    assert r.exit_code == 0, r.output
    kinds = {(g["kind"], g["text"]) for g in json.loads(r.stdout)["guards"]}
    assert ("assumed", "n <= 2048 (else: a build at the call's exact shape)") in kinds
    assert not [k for k in kinds if k[0] == "fact"]


def test_explain_the_encoder_shows_its_fused_gelu(tmp_path):
    path = tmp_path / "encoder.onnx"
    onnx.save(build_encoder(layers=1), str(path))
    out = tmp_path / "enc.ds"
    r = invoke("compile", path, "--dim", "batch=1:4", "--dim", "seq=1:32", "--specialize", "batch=1,seq=8",
               "-o", out)
    assert r.exit_code == 0, r.output
    data = json.loads(invoke("explain", out, "--json").stdout)
    gelu = [[o["op"] for o in k["ops"]] for k in data["kernels"] if any(o["op"] == "Erf" for o in k["ops"])]
    assert gelu == [["MatMul", "Add", "Div", "Erf", "Add", "Mul", "Mul"]]  # the GELU is the FFN product's epilogue
    assert [v["values"] for v in data["variants"]] == [None, {"batch": 1, "seq": 8}]
    assert data["memory"]["bytes"] > 4 * 32 * 64  # at least one (4, 32, 64) float32 activation
    r = invoke("run", out, "--shape", "1x8")
    assert r.exit_code == 0, r.output


def test_explain_and_compile_precision(tmp_path):
    """--precision reaches the build: explain marks the bf16 kernels (products and attention) and lists the option;
    compile writes an artefact that keeps it."""
    path = tmp_path / "enc.onnx"
    onnx.save(build_encoder(layers=1, hidden=32, heads=2, ffn=64), path)
    r = invoke("explain", path, "--precision", "bf16-emulated", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    low = [k for k in data["kernels"] if k["method"].startswith("bf16")]
    assert {k["kind"] for k in low} == {"product", "attention"}
    assert next(o for o in data["options"] if o["name"] == "precision")["value"] == "bf16-emulated"
    text = invoke("explain", path, "--precision", "bf16-emulated")
    assert f"precision: {len(low)} kernel(s) multiply in bf16" in flat(text.stdout)
    out = tmp_path / "art"
    c = invoke("compile", path, "-o", out, "--precision", "bf16-emulated")
    assert c.exit_code == 0, c.output
    assert json.loads((out / "config.json").read_text())["options"]["precision"] == "bf16-emulated"
