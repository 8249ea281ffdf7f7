"""Every command end to end through typer's CliRunner, including the bad invocations and their exit codes."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from typer.testing import CliRunner

from dynshape.cli.common import has_module
from dynshape.cli.main import app
from tolerance import assert_f32_close

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def flat(text: str) -> str:
    """Whitespace collapsed, so assertions do not depend on where rich wraps a line."""
    return " ".join(text.split())


# ---- help and entry points ----------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", [[], ["inspect"], ["run"], ["bench"], ["demo"]])
def test_help_shows_examples(cmd):
    r = invoke(*cmd, "--help")
    assert r.exit_code == 0
    assert "Examples" in r.stdout and "dynshape " in r.stdout


def test_python_dash_m_is_the_same_cli():
    r = subprocess.run([sys.executable, "-m", "dynshape", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Exit codes" in r.stdout and "inspect" in r.stdout and "bench" in r.stdout


# ---- inspect --------------------------------------------------------------------------------------------
def test_inspect_shows_signature_shapes_bounds_and_memory(models):
    r = invoke("inspect", models["mlp"], "--dim", "batch=1:8")
    assert r.exit_code == 0, r.output
    out = flat(r.stdout)
    assert "batch in [1, 8]" in out
    assert "y: float32[batch, 3]" in out
    assert re.search(r"\bh MatMul float32\[batch, 3\] 3\*batch 24\b", out)
    assert "worst-case memory" in out


def test_inspect_json(models):
    r = invoke("inspect", models["mlp"], "--dim", "batch=2:8:2", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["symbols"] == [{"name": "batch", "min": 2, "max": 8, "multiple_of": 2, "default_range": False}]
    bounds = {t["name"]: t["numel_bound"] for t in data["tensors"]}
    assert bounds == {"x": 32, "h": 24, "a": 24, "y": 24}
    assert data["memory_bound"]["bytes"] >= 32 * 4


def test_inspect_unbounded_dims_say_so(models):
    r = invoke("inspect", models["mlp"], "--json")
    data = json.loads(r.stdout)
    assert data["symbols"][0]["max"] is None
    assert data["memory_bound"]["bytes"] is None and "batch" in data["memory_bound"]["unbounded"]
    assert {t["numel_bound"] for t in data["tensors"]} == {None}


def test_inspect_shows_the_default_range_admits_empty_tensors(models):
    """An undeclared named dim is [0, inf] (ONNX admits empty tensors): inspect marks it and says how to
    exclude 0; a declared one is not marked."""
    r = invoke("inspect", models["mlp"])
    out = flat(r.stdout)
    assert "batch in [0, inf] (default range)" in out and "--dim NAME=1:" in out
    data = json.loads(invoke("inspect", models["mlp"], "--json").stdout)
    assert data["symbols"][0]["default_range"] is True and data["symbols"][0]["min"] == 0
    out = flat(invoke("inspect", models["mlp"], "--dim", "batch=1:").stdout)
    assert "batch in [1, inf]" in out and "(default range)" not in out


def test_inspect_lists_facts_inference_found(models):
    r = invoke("inspect", models["reshape"])
    assert r.exit_code == 0, r.output
    out = flat(r.stdout)
    assert "n == 100" in out and "Reshape" in out
    assert "x: float32[100]" in out


# ---- run ------------------------------------------------------------------------------------------------
def test_run_reads_npy_and_writes_outputs(models, tmp_path):
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = invoke("run", models["mlp"], "--input", f"x={tmp_path / 'x.npy'}", "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert re.search(r"executor: dynshape (reference|\(compiled\))", r.stdout)
    w = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(models["mlp"])).graph.initializer}
    y = np.load(tmp_path / "out" / "y.npy")
    assert_f32_close(y, np.maximum(x @ w["W"] + w["B"], 0), rtol=1e-6, scale=1e-6)


def test_run_says_when_it_falls_back_to_the_reference_executor(models, monkeypatch):
    import dynshape as ds

    monkeypatch.setattr(ds, "compile", None, raising=False)
    r = invoke("run", models["mlp"], "--random", "x=2,4")
    assert r.exit_code == 0, r.output
    assert "executor: dynshape reference (numpy)" in r.stdout
    assert "dynshape.compile is not available" in flat(r.stdout)


def test_run_summary_without_outdir(models):
    r = invoke("run", models["mlp"], "--random", "x=5,4")
    assert r.exit_code == 0, r.output
    assert re.search(r"\by\s.*\(5, 3\)\s.*float32", r.stdout)


def test_random_token_ids_stay_inside_the_table(models, tmp_path):
    # y[..., 0] = 2 * id (table row id is [2*id, 2*id+1]); the table has 50 rows
    r = invoke("run", models["tokens"], "--random", "input_ids=8,64", "--random", "attention_mask=8,64:1:2",
               "-o", tmp_path)
    assert r.exit_code == 0, r.output
    ids = np.load(tmp_path / "y.npy")[..., 0] / 2
    assert ids.min() >= 0 and ids.max() < 50 and ids.max() > 25
    r = invoke("run", models["tokens"], "--random", "input_ids=8,64:3:5", "--shape", "8x64", "-o", tmp_path)
    assert r.exit_code == 0, r.output
    assert set(np.unique(np.load(tmp_path / "y.npy")[..., 0] / 2)) == {3.0, 4.0}  # generated mask: all ones


# ---- exit code 2: bad invocation ------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["inspect", "MISSING.onnx"], "does not exist"),
    (["inspect", "{mlp}", "--dim", "batch"], "expected NAME=MIN:MAX"),
    (["inspect", "{mlp}", "--dim", "batch=a:b"], "expected NAME=MIN:MAX"),
    (["inspect", "{mlp}", "--dim", "batch=1:4", "--dim", "batch=2:8"], "declared twice"),
    (["run", "{mlp}", "--random", "x=2;4"], "a shape is non-negative integers"),
    (["run", "{mlp}", "--random", "x=2,4:5:1"], "LOW must be below HIGH"),
    (["run", "{mlp}", "--input", "x=nowhere.npy"], "does not exist"),
    (["bench", "{mlp}", "--shapes", "2", "--stream", "{mlp}"], "at most one of --shapes and --stream"),
    (["bench", "{mlp}", "--shapes", "2", "--vs", "tensorflow"], "unknown system"),
    (["frobnicate"], "No such command"),
])
def test_bad_invocations_exit_2(models, args, message):
    r = invoke(*[a.format(**models) for a in args])
    assert r.exit_code == 2, r.output
    assert message in flat(r.stderr)
    assert "Traceback" not in r.output


# ---- exit code 1: bad model, input or constraint --------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["inspect", "{garbage}"], r"cannot read .*garbage.onnx"),
    (["inspect", "{unsupported}"], r"1 op type\(s\) dynshape does not support: com.example::Frobnicate"),
    (["inspect", "{mlp}", "--dim", "batch=8:1"], r"min=8 > max=1"),
    (["inspect", "{mlp}", "--dim", "seq=1:8"], r"\['seq'\], which the model's inputs do not use"),
    (["inspect", "{reshape}", "--dim", "n=1:50"], r"n == 100.*n in \[1, 50\]"),
    (["run", "{mlp}", "--random", "x=2,5"], r"^ConstraintViolation: input 'x'"),
    (["run", "{mlp}", "--dim", "batch=1:4", "--random", "x=5,4"], r"batch = 5 is outside its range \[1, 4\]"),
    (["run", "{mlp}", "--input", "x={bad_npy}"], r"cannot read .*bad.npy.* for input 'x'"),
    (["run", "{mlp}", "--input", "nope={good_npy}"], r"no input of that name; its inputs are x"),
    (["run", "{mlp}"], r"no data for input\(s\) x"),
    (["run", "{mlp}", "--shape", "2x3"], r"2 value\(s\), but the model has 1 symbol"),
    (["bench", "{tokens}", "--stream", "{stream}", "--stream-key", "bert"], r"no stream 'bert' \(it has tokens\)"),
])
def test_user_errors_exit_1_with_one_message(models, tmp_path, args, message):
    (tmp_path / "bad.npy").write_text("not an array")
    np.save(tmp_path / "good.npy", np.zeros((2, 4), np.float32))
    (tmp_path / "stream.json").write_text(json.dumps({"streams": {"tokens": [{"batch": 1, "seq": 2}]}}))
    paths = {**models, "bad_npy": tmp_path / "bad.npy", "good_npy": tmp_path / "good.npy",
             "stream": tmp_path / "stream.json"}
    r = invoke(*[a.format(**paths) for a in args])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    err = flat(r.stderr)
    assert re.search(message, err), err
    assert re.match(r"(error|ModelError|ShapeError|ConstraintViolation): ", err)


# ---- bench ----------------------------------------------------------------------------------------------
def test_bench_shapes_table_and_plot(models, tmp_path):
    png = tmp_path / "lat.png"
    r = invoke("bench", models["mlp"], "--shapes", "1,4,16", "--vs", "onnxruntime,torch", "--plot", png, "-n", "3")
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("|")]
    header, rows = lines[0], lines[2:]
    assert header.startswith("| shape | dynshape ")
    assert [row.split("|")[1].strip() for row in rows] == ["1", "4", "16", "total timed"]
    n_systems = 2 if has_module("onnxruntime") else 1
    assert all(row.count("|") == 2 + 2 * n_systems for row in lines)
    assert ("onnxruntime p50 ms" in header) == has_module("onnxruntime")
    assert "torch: " in flat(r.stdout) and "skipped" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_precision_reports_accuracy_against_fp32(models):
    r = invoke("bench", models["mlp"], "--shapes", "1,16", "--vs", "", "-n", "2", "--precision", "bf16-emulated")
    assert r.exit_code == 0, r.output
    out = flat(r.stdout)
    assert "accuracy of bf16-emulated against the float32 build" in out
    errs = [float(m) for m in re.findall(r"max ([0-9.e+-]+),", out)]
    assert len(errs) == 2 and max(errs) > 1e-5 and all(e < 5e-2 for e in errs)  # rounded to bf16, and close
    header = next(ln for ln in r.stdout.splitlines() if ln.startswith("|"))
    assert "dynshape (compiled, bf16-emulated) p50" in header and "dynshape (compiled) p50" in header
    bad = invoke("bench", models["mlp"], "--shapes", "1", "--vs", "", "--precision", "fp16")
    assert bad.exit_code == 1 and "precision='fp16'" in flat(bad.output)


def test_bench_stream_groups_requests_by_shape(models, tmp_path):
    reqs = [{"batch": 1, "seq": 3, "data_seed": 5}, {"batch": 2, "seq": 4, "data_seed": 6},
            {"batch": 1, "seq": 3, "data_seed": 7}]
    stream = tmp_path / "s.json"
    stream.write_text(json.dumps({"streams": {"tokens": reqs, "other": []}}))
    r = invoke("bench", models["tokens"], "--stream", stream, "--vs", "", "-n", "2")
    assert r.exit_code == 0, r.output
    assert "3 request(s), 2 distinct shape(s) (batch x seq), 2 timed call(s) each" in flat(r.stdout)
    rows = [ln.split("|")[1].strip() for ln in r.stdout.splitlines() if ln.startswith("|")]
    assert rows[2:] == ["1x3", "2x4", "total timed"]


# ---- demo -----------------------------------------------------------------------------------------------
def test_demo_runs_the_encoder_stream(models):
    r = invoke("demo", "--shapes", "3")
    assert r.exit_code == 0, r.output
    out = flat(r.stdout)
    for text in ("batch in [1, 8]", "seq in [1, 256]", "last_hidden_state: float32[batch, seq, 64]",
                 "float32[batch, 4, seq, seq]", "worst-case memory", "a stream of 3 shapes",
                 "seq = 300 is outside its range [1, 256]", "demo took"):
        assert text in out, text
    if has_module("onnxruntime"):
        assert re.search(r"cross-checked against (reference, )?onnxruntime", out) and "all within 0.0001" in out
    assert len(re.findall(r"^\s+\d+\s+\d+\s+[\d.]+", r.stdout, re.M)) == 3  # one latency row per shape


def test_demo_sym_tour():
    r = invoke("demo", "--sym")
    assert r.exit_code == 0, r.output
    assert "proofs" in r.stdout and "contradiction" in r.stdout


def test_stream_file_of_the_shared_benchmark_is_understood(models, tmp_path):
    shared = Path(__file__).resolve().parents[2].parent / "shared" / "bench" / "request_stream.json"
    if not shared.exists():
        pytest.skip("shared/bench is not next to this checkout")
    streams = json.loads(shared.read_text())["streams"]
    small = {"streams": {"tokens": [dict(r, seq=min(r["seq"], 8)) for r in streams["bert_small"][:4]]}}
    (tmp_path / "s.json").write_text(json.dumps(small))
    r = invoke("bench", models["tokens"], "--stream", tmp_path / "s.json", "--vs", "", "-n", "1")
    assert r.exit_code == 0, r.output


def test_demo_exits_1_when_a_cross_check_disagrees(monkeypatch):
    import dynshape as ds
    from dynshape.cli import demo_cmd

    if not has_module("onnxruntime") and getattr(ds, "compile", None) is None:
        pytest.skip("nothing to cross-check against")
    monkeypatch.setattr(demo_cmd, "TOLERANCE", -1.0)  # every difference, even 0, now counts as a mismatch
    r = invoke("demo", "--shapes", "1")
    assert r.exit_code == 1
    assert "NOT all within" in r.stdout and "the cross-check failed" in flat(r.stderr)
