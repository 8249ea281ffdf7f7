"""ONNX's own backend node suite, all 1,884 cases, through dynshape's plain public API.

Runs `../shared/onnx_node_suite.py` (beside the repository; `DYNSHAPE_NODE_SUITE` overrides the path) over every
node case, plain and with every input dim made symbolic, for the reference executor (`graph.run`) and the
compiled executable (`ds.compile(graph).run`); the backends are `backend_reference.py` and
`backend_compiled.py`, three lines of public API each. Each run must
- pass at least 97% of the cases, and
- fail exactly the cases `known_failures.json` lists for it, each with its reason: a case that newly fails
  fails the test, and so does a listed case that now passes (remove it from the list), so the figure can
  neither regress nor drift silently. Cases marked `random` (an expected output that is a random draw) may go
  either way.

Cost (measured on 2 cores): the reference backend runs the whole suite in ~5 s a mode, the compiled one in
~45 s a mode with a cold C build cache (~7 s warm), so the four runs fit well inside CI's limit without
sharding; each still has its own 15-minute timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SUITE = Path(os.environ.get("DYNSHAPE_NODE_SUITE") or ROOT.parent / "shared" / "onnx_node_suite.py")
DATA = Path(os.environ.get("ONNX_SUITE_DATA") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            / "onnx_node_suite")
KNOWN = json.loads((HERE / "known_failures.json").read_text())["cases"]
MIN_PASS_RATE = 0.97
MIN_CASES = 1884  # onnx 1.23.2's node cases; fewer means the material is incomplete, not that dynshape improved

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SUITE.is_file(), reason=f"node suite runner not found at {SUITE} (../shared absent)"),
]


def _suite(*args: str, timeout: float) -> subprocess.CompletedProcess:
    # the child processes build into the session's private cache (tests/conftest.py), never the user's
    assert os.environ.get("DYNSHAPE_CACHE_DIR"), "the suite-wide private build cache is not in place"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(SUITE), "--data", str(DATA), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def known_for(backend: str, mode: str) -> dict[str, dict]:
    """The listed failures that apply to this backend and mode."""
    return {name: e for name, e in KNOWN.items()
            if backend in e.get("backends", ("reference", "compiled")) and mode in e.get("modes", ("plain",
                                                                                                   "symbolic"))}


def generator_versions() -> str:
    """What made the expected outputs: ONNX's case generators compute them with numpy and ml_dtypes at
    materialize time, and where the spec leaves a value undefined (a float outside int4's range, say) the
    value is whatever those versions give (ml_dtypes 0.7 maps such a float to 0 where 0.5 wrapped). Material
    made by another environment than the one under test would fail those cases on agreement with the spec."""
    import ml_dtypes
    import numpy
    import onnx
    return f"onnx {onnx.__version__}, ml_dtypes {ml_dtypes.__version__}, numpy {numpy.__version__}\n"


@pytest.fixture(scope="module")
def materialized() -> Path:
    stamp = DATA / "dynshape-generator-versions.txt"
    if not (DATA / "node").is_dir() or not stamp.is_file() or stamp.read_text() != generator_versions():
        shutil.rmtree(DATA / "node", ignore_errors=True)
        r = _suite("materialize", timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
        stamp.write_text(generator_versions())
    return DATA


def test_known_failures_have_reasons() -> None:
    for name, e in KNOWN.items():
        assert e.get("reason"), f"{name}: every listed failure says why"
        assert set(e) <= {"reason", "backends", "modes", "random"}, f"{name}: unknown keys {sorted(e)}"


@pytest.mark.parametrize("backend", ["reference", "compiled"])
@pytest.mark.parametrize("mode", ["plain", "symbolic"])
def test_node_suite(materialized: Path, mode: str, backend: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    args = ["run", "--backend", str(HERE / f"backend_{backend}.py"), "--jobs", "2", "--timeout", "120", "--quiet",
            "--json", str(report)]
    r = _suite(*args, *(["--symbolic"] if mode == "symbolic" else []), timeout=900)
    assert r.returncode == 0 and report.is_file(), r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(report.read_text())
    cases = {c["name"]: c for c in data["cases"]}
    assert len(cases) >= MIN_CASES, f"only {len(cases)} node cases ran; expected {MIN_CASES} (re-materialize)"
    known = known_for(backend, mode)
    failed = {n for n, c in cases.items() if c["status"] != "pass"}
    new = sorted(failed - known.keys())
    fixed = sorted(n for n, e in known.items() if not e.get("random") and cases.get(n, {}).get("status") == "pass")
    absent = sorted(known.keys() - cases.keys())
    problems = [f"newly failing: {n}: {cases[n]['message'][:300]}" for n in new]
    problems += [f"listed in known_failures.json but passes now (remove it): {n}" for n in fixed]
    problems += [f"listed in known_failures.json but not in the suite: {n}" for n in absent]
    rate = (len(cases) - len(failed)) / len(cases)
    assert not problems, f"{backend} {mode}: {len(problems)} difference(s) from the known failures:\n" + \
        "\n".join(problems)
    assert rate >= MIN_PASS_RATE, f"{backend} {mode}: pass rate {rate:.2%} < {MIN_PASS_RATE:.0%}"
