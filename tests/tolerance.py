"""The suite's one tolerance for float32 results (issue 28).

A float32 kernel's summation order depends on the CPU it runs on: the vector width (AVX-512 or AVX2), FMA
contraction, the GEMM micro-kernel and blocking chosen for the ISA (AMX or not), the threads, and the BLAS numpy
or onnxruntime dispatch to. Each order rounds differently, by a few units in the last place of the *largest*
partial sums, so the error is proportional to the output's magnitude, not to 1: a fixed `atol=1e-6` tuned on one
machine failed on an AMD EPYC (Zen 4) where the outputs were ~60 (max abs diff 1.6e-05). An absolute tolerance
relative to max|expected| holds on every CPU the project supports, and is no looser than the old fixed one for
outputs of magnitude ~1 it was written for.

Tests import it as `from tolerance import assert_f32_close` (tests/ is on sys.path: pytest's rootdir import mode
puts the directory of tests/conftest.py there).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def f32_atol(expected, scale: float = 1e-5) -> float:
    """`scale * max|expected|` over the finite elements (complex ones by modulus); `scale` itself (magnitude 1)
    when there are none or all are zero, as no magnitude is there to scale by."""
    e = np.abs(np.asarray(expected)).astype(np.float64)
    finite = e[np.isfinite(e)]
    mag = float(finite.max()) if finite.size else 0.0
    return scale * (mag if mag > 0 else 1.0)


def _numpy(x):
    return x.detach().cpu().numpy() if hasattr(x, "detach") else x  # a torch tensor


def assert_f32_close(actual, expected, rtol: float = 1e-5, scale: float = 1e-5, err_msg: str = "") -> None:
    """np.testing.assert_allclose(actual, expected, rtol, atol=f32_atol(expected, scale)).

    Dicts (the same keys) and lists/tuples of arrays or tensors are compared item by item, each with its own
    magnitude; anything else is one array. NaNs compare equal, as in assert_allclose."""
    if isinstance(expected, Mapping):
        assert set(actual) == set(expected), f"{err_msg} keys {sorted(actual)} != {sorted(expected)}"
        for k in expected:
            assert_f32_close(actual[k], expected[k], rtol, scale, f"{err_msg} [{k!r}]")
        return
    if isinstance(expected, (list, tuple)) and expected and all(hasattr(e, "shape") for e in expected):
        assert len(actual) == len(expected), f"{err_msg} {len(actual)} items != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_f32_close(a, e, rtol, scale, f"{err_msg} [{i}]")
        return
    actual, expected = _numpy(actual), _numpy(expected)
    atol = f32_atol(expected, scale)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol,
                               err_msg=f"{err_msg} (atol {atol:.3g} = {scale:g} * max|expected|)".strip())
