"""The malformed-model fuzzer's bounded CI run (issue 15): a few hundred mutants of the seed models, each loaded,
compiled and run in a worker with a timeout and compared with onnxruntime; the only outcomes allowed are a
correct result, a DynshapeError, or a hang onnxruntime shares. `python bench/fuzz_models.py --cases 4000` is
the long run. Also checks the fuzzer itself: deterministic cases, and a classifier that does flag failures."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import fuzz_models as fm  # noqa: E402

CI_CASES = 650  # 50 mutants of each of the 13 seeds


def test_cases_are_deterministic_and_cover_every_seed():
    a = [fm.make_case(i) for i in range(26)]
    b = [fm.make_case(i) for i in range(26)]
    assert [(s.name, d) for s, d, _ in a] == [(s.name, d) for s, d, _ in b]
    assert {s.name for s, _, _ in a} == {s.name for s in fm.SEEDS}
    assert len({d for _, d, _ in a}) == 26


@pytest.mark.parametrize(("ds", "ort", "outcome"), [
    ({"status": "other", "error": "IndexError: x", "site": "a.py:1"}, {"status": "rejected"}, "other_exception"),
    ("died", "skipped", "crash"),
    ("timeout", "ran", "hang"),
    ("timeout", "shared", "hang_shared"),
    ({"status": "ok", "ref_mismatch": None}, {"status": "ok", "mismatch": "vs onnxruntime, output 'y': values"},
     "wrong_result"),
    ({"status": "ok", "ref_mismatch": "compiled vs reference, output 'y': shape"}, {"status": "rejected"},
     "wrong_result"),
    ({"status": "ok", "ref_mismatch": None}, {"status": "ok", "mismatch": None}, "correct"),
    ({"status": "clean", "error": "ModelError: x"}, {"status": "rejected"}, "clean_error"),
])
def test_classifier_flags_every_forbidden_outcome(ds, ort, outcome):
    assert fm.classify(ds, ort)[0] == outcome


def test_output_comparison_separates_real_and_non_finite_disagreements():
    a = np.array([1.0, np.nan, 3.0], np.float32)
    assert fm._same(a, a.copy()) is None
    assert fm._same(a, np.array([1.0, np.inf, 3.0], np.float32)) == fm.NONFINITE
    assert fm._same(a, np.array([1.0, np.nan, 3.1], np.float32)).startswith("values differ")
    assert fm._same(a, a[:2]).startswith("shape")
    assert fm._same(a, a.astype(np.float64)).startswith("dtype")


def test_bounded_fuzz_run_has_no_forbidden_outcome():
    pytest.importorskip("onnxruntime")
    t0 = time.monotonic()
    results = fm.run_cases(list(range(CI_CASES)), jobs=2, timeout=60)
    s = fm.summary(results)
    assert s["cases"] == CI_CASES
    bad = [f"case {f['case']} ({f['seed']}): {f['outcome']}: {f['detail']} [{'; '.join(f['mutations'])}]"
           for f in s["failures"]]
    assert not bad, "\n".join(bad) + "\nreproduce one with: python bench/fuzz_models.py --case N"
    assert s["counts"]["correct"] > 0 and s["counts"]["clean_error"] > 0  # both kinds of mutants were made
    assert time.monotonic() - t0 < 120
