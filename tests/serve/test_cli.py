"""`dynshape serve`: --help documents every flag; the command serves an ONNX file from a real process."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import numpy as np
import onnx
import tritonclient.http as httpclient
from typer.testing import CliRunner

from dynshape.cli.main import app

FLAGS = ["--name", "--dim", "--host", "--port", "--grpc-port", "--strategy", "--instances", "--threads",
         "--max-batch-size", "--max-queue-delay-us", "--preferred-batch-size", "--max-queue-size",
         "--default-timeout-us", "--priority-levels", "--default-priority-level", "--pad", "--inline-below-us",
         "--max-request-bytes", "--access-log"]


def test_help_documents_every_flag():
    r = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert r.exit_code == 0
    text = re.sub(r"\x1b\[[0-9;]*m", "", r.output)
    for flag in FLAGS:
        line = next((ln for ln in text.splitlines() if flag + " " in ln), None)
        assert line is not None, flag
        assert len(line.split(flag, 1)[1].strip()) > 10, f"{flag} has no help text"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_command_serves_an_onnx_file(tmp_path, mlp_ref):
    from dynshape.models.mlp import build_mlp

    path = tmp_path / "tiny.onnx"
    onnx.save(build_mlp(), str(path))
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dynshape", "serve", str(path), "--name", "m", "--dim",
                             "batch=1:64", "--port", str(port), "--max-queue-delay-us", "1000", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        c = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while True:
            try:
                if c.is_server_ready():
                    break
            except Exception:  # noqa: BLE001 (not listening yet)
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
            time.sleep(0.1)
        x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
        i = httpclient.InferInput("x", [4, 64], "FP32")
        i.set_data_from_numpy(x)
        y = c.infer("m", [i]).as_numpy("y")
        np.testing.assert_allclose(y, mlp_ref.run({"x": x})["y"], rtol=1e-5, atol=1e-5 * np.abs(y).max())
        assert c.get_model_metadata("m")["dynshape"]["symbols"][0]["max"] == 64
    finally:
        proc.terminate()
        proc.wait(20)


def test_serves_an_artefact_folder(tmp_path, mlp_ref):
    """`dynshape compile` output is served through ds.load (nothing recompiled)."""
    from dynshape.models.mlp import build_mlp
    from dynshape.serve import ModelSpec, ServerConfig
    from dynshape.serve.server import Server

    path = tmp_path / "tiny.onnx"
    onnx.save(build_mlp(), str(path))
    r = CliRunner().invoke(app, ["compile", str(path), "--dim", "batch=1:64", "-o", str(tmp_path / "tiny.ds")])
    assert r.exit_code == 0, r.output
    with Server([ModelSpec(str(tmp_path / "tiny.ds"))], ServerConfig(port=0)) as srv:
        c = httpclient.InferenceServerClient(srv.url)
        assert c.get_model_metadata("tiny")["dynshape"]["symbols"][0]["max"] == 64
        x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
        i = httpclient.InferInput("x", [3, 64], "FP32")
        i.set_data_from_numpy(x)
        y = c.infer("tiny", [i]).as_numpy("y")
        np.testing.assert_allclose(y, mlp_ref.run({"x": x})["y"], rtol=1e-5, atol=1e-5 * np.abs(y).max())
