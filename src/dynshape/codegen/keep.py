"""What a bound plan's raw addresses point into, kept alive as long as the plan.

A plan is made per key and up to 256 of them are cached per arena, so what each holds is resident memory that
grows with the number of shapes seen. Most of it was small int64 tables (a strided copy's descriptor, a kernel's
key, a row kernel's arguments, a program), each its own numpy array, and views of the arena kept only so that
their buffer lived: text recognition (SVTR) held ~60 such objects a plan, 2-3x their data in headers and
allocator rounding. `Keep.table` packs the tables into shared chunks instead, and `Keep.hold` keeps a view's
underlying buffer (already held: the arena, a constant) rather than the view.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FIRST_CHUNK_BYTES = 512  # a plan's first chunk of small tables; each next one twice the last, up to
MAX_CHUNK_BYTES = 4096  # (a table over half of that gets an array of its own). Why grow: byte_cls's plans fill
# two chunks (0.5-1.5 KB of tables), text recognition's (SVTR) three (1.5-3.5 KB)
TABLE_ALIGN = 8  # every table starts on an int64 boundary


class Keep(list):
    """The plan's list of kept objects, with the chunk its small tables are written into."""

    __slots__ = ("_base", "_chunk", "_used")  # no per-plan __dict__

    def __init__(self) -> None:
        super().__init__()
        self._chunk: np.ndarray | None = None
        self._base = 0
        self._used = 0

    def table(self, values: Sequence | np.ndarray, dtype: type | np.dtype = np.int64) -> int:
        """The address of a contiguous copy of `values` (as `dtype`) that lives as long as the plan."""
        own = np.array(values, dtype=dtype).reshape(-1)  # a copy: the caller may reuse `values`
        raw = own.view(np.uint8)
        n = -(-raw.size // TABLE_ALIGN) * TABLE_ALIGN
        if n > MAX_CHUNK_BYTES // 2 or n == 0:
            own = own if own.size else np.zeros(1, dtype)
            self.append(own)
            return own.ctypes.data
        if self._chunk is None or self._used + n > self._chunk.size:
            size = FIRST_CHUNK_BYTES if self._chunk is None else min(2 * self._chunk.size, MAX_CHUNK_BYTES)
            self._chunk = np.empty(max(size, n), np.uint8)
            self._base, self._used = self._chunk.ctypes.data, 0
            self.append(self._chunk)
        self._chunk[self._used:self._used + raw.size] = raw
        at = self._base + self._used
        self._used += n
        return at

    def hold(self, a: np.ndarray) -> None:
        """Keep the buffer under a view (its last ndarray base), not the view: the view's own header is all it
        would add, and the plan needs only the memory it points into."""
        while isinstance(a.base, np.ndarray):
            a = a.base
        self.append(a)
