"""Large arrays on pages of their own, for what a compile materialises (folded and packed weights).

Why not numpy's allocator: numpy advises transparent huge pages for every array of 4 MB and up, and with the
kernel's THP defrag on "madvise" (this machine's, and a common default) the first touch of such pages may stall
in memory compaction: ResNet-50's BatchNorm folding (100 MB of scaled conv weights) took 0.04 s in one warm
compile and 0.55 s in another. Anonymous mappings without the advice never compact; numpy frees them with the
array (the array owns its mmap).
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

#: arrays from this size get a mapping of their own (below it numpy's allocator never advises huge pages)
OWN_PAGES_BYTES = 4 << 20


def fresh_array(shape: int | tuple, dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array; from OWN_PAGES_BYTES on, page-aligned on a mapping of its own."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if n < OWN_PAGES_BYTES:
        return np.empty(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, n), dtype=dtype).reshape(shape)
