"""ONNX's own backend node tests for dynshape's op set, through the reference executor and the compiled one.

Runs `../shared/onnx_node_suite.py` (beside the repository) in plain and symbolic mode and requires every case
of the op types in opset.txt to pass, except the training-mode Dropout cases whose outputs depend on onnx's
random mask draws.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SUITE = ROOT.parent / "shared" / "onnx_node_suite.py"
DATA = Path(os.environ.get("ONNX_SUITE_DATA") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            / "onnx_node_suite")
RANDOM_MASK_CASES = {"test_training_dropout", "test_training_dropout_default", "test_training_dropout_mask",
                     "test_training_dropout_default_mask"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SUITE.is_file(), reason=f"node suite runner not found at {SUITE} (../shared absent)"),
]


def _suite(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(SUITE), "--data", str(DATA), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def materialized() -> Path:
    if not (DATA / "node").is_dir():
        r = _suite("materialize", timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
    return DATA


@pytest.mark.parametrize("backend", ["reference", "compiled"])
@pytest.mark.parametrize("mode", ["plain", "symbolic"])
def test_node_suite(materialized: Path, mode: str, backend: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    args = ["run", "--backend", str(HERE / f"backend_{backend}.py"), "--ops", str(HERE / "opset.txt"),
            "--jobs", "2", "--timeout", "60", "--quiet", "--json", str(report)]
    r = _suite(*args, *(["--symbolic"] if mode == "symbolic" else []), timeout=300)
    assert r.returncode == 0 and report.is_file(), r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(report.read_text())
    ops = set((HERE / "opset.txt").read_text().split())
    assert ops <= set(data["per_op"]), f"op types without any case: {sorted(ops - set(data['per_op']))}"
    failed = [f"{c['name']}: {c['message'][:300]}" for c in data["cases"]
              if c["status"] != "pass" and c["name"] not in RANDOM_MASK_CASES]
    assert data["summary"]["cases"] > 900
    assert not failed, f"{len(failed)} {mode} failures:\n" + "\n".join(failed)
