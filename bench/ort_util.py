"""onnxruntime as every benchmark runs it: all graph optimisations, `threads` intra-op threads, one inter-op thread,
sequential execution. One place, so that every peer figure means the same configuration (the benches each built
their own session options before). Depends on nothing of the project's, so test-imported bench modules may use it."""

from __future__ import annotations

from typing import Any


def ort_session(path_or_bytes: str | bytes, threads: int = 1, profile_prefix: str | None = None,
                log_level: int = 3) -> Any:
    """An InferenceSession on the CPU provider; with `profile_prefix`, its per-node profile on
    (bench/step_profile.py). `log_level`: onnxruntime's severity threshold (3: errors, 4: fatal only)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = log_level
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return ort.InferenceSession(path_or_bytes, so, providers=["CPUExecutionProvider"])
