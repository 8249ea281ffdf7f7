"""What the benchmark scripts share: ../shared/bench on the path, the models' dims, BLAS thread limits."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "bench"
sys.path.insert(0, str(SHARED))

DIMS = {"bert_small": {"batch": (1, 8), "seq": (1, 512)}, "mlp": {"batch": (1, 256)}}


def limit_threads(n: int):
    """Limit every loaded BLAS/OpenMP pool to n threads (call again after a library loads lazily)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        os.environ["OMP_NUM_THREADS"] = str(n)
        return None
    return threadpool_limits(n)


import common  # noqa: E402  (from ../shared/bench, on the path above)
import peers  # noqa: E402

__all__ = ["DIMS", "SHARED", "common", "limit_threads", "peers"]
