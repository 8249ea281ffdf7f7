"""What a bound plan's raw addresses point into, kept alive as long as the plan.

A plan is made per key and up to 256 of them are cached per arena, so what each holds is resident memory that
grows with the number of shapes seen. Most of it was small int64 tables (a strided copy's descriptor, a kernel's
key, a row kernel's arguments), each its own numpy array, and views of the arena kept only so that their buffer
lived: text recognition (SVTR) held ~60 such objects a plan, 2-3x their data in headers and allocator rounding.
`Keep.table` collects the tables while the plan is bound and `Keep.seal` writes them all into one buffer of their
exact total size (a binder gets a `TableRef` whose address is known once sealed; `resolved` puts the addresses
into its calls), and `Keep.hold` keeps a view's underlying buffer (already held: the arena, a constant) rather than
the view.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dynshape.codegen.lowering import NativeCall

TABLE_ALIGN = 8  # every table starts on an int64 boundary


class TableRef:
    """A table's bytes until its plan is sealed, then its address (`addr`)."""

    __slots__ = ("addr", "data", "nbytes")

    def __init__(self, data: bytes) -> None:
        self.data: bytes | None = data
        self.addr = 0
        self.nbytes = len(data)


class Keep(list):
    """The plan's list of kept objects, and the tables waiting for `seal`. With `track_ints`, `int_tables` lists
    the sealed int64 tables as int64 views (a plan whose inputs are read in place patches the addresses in them)."""

    __slots__ = ("_pending", "_ints", "int_tables", "buffers", "checks")  # no per-plan __dict__

    def __init__(self, track_ints: bool = False) -> None:
        super().__init__()
        self._pending: list[TableRef] = []
        self._ints: set[int] | None = set() if track_ints else None
        self.int_tables: list[np.ndarray] = []
        self.buffers: list[np.ndarray] = []  # the sealed tables' buffers (what a bucket plan rewrites in place)
        # (table, word, fail) of each status word a native call sets when it refuses its input (an index out of
        # range): the plan reads them after its calls and calls fail(table words, status) (BoundPlan.execute)
        self.checks: list[tuple[TableRef, int, Any]] = []

    @property
    def track_ints(self) -> bool:
        return self._ints is not None

    def table(self, values: Sequence | np.ndarray, dtype: type | np.dtype = np.int64) -> TableRef:
        """A contiguous copy of `values` (as `dtype`) that lives as long as the plan: a native call takes the
        returned ref as the argument, its address filled in by `seal` and `resolved`."""
        ref = TableRef(np.array(values, dtype=dtype).reshape(-1).tobytes())  # a copy: the caller may reuse values
        if self._ints is not None and np.dtype(dtype) == np.int64:
            self._ints.add(id(ref))
        self._pending.append(ref)
        return ref

    def check(self, ref: TableRef, word: int, fail: Any) -> None:
        """Word `word` of table `ref` is a status its call sets (0: fine); `fail(words, status)` raises, naming the
        node, where it is set."""
        self.checks.append((ref, word, fail))

    def seal(self) -> None:
        """Every table collected so far into one buffer of their total size (each on an int64 boundary)."""
        self._pending = [r for r in self._pending if r.data is not None]  # (a table placed elsewhere: rekey.py)
        if not self._pending:
            return
        sizes = [max(TABLE_ALIGN, -(-len(r.data) // TABLE_ALIGN) * TABLE_ALIGN) for r in self._pending]
        # one bytes object of the padded tables, viewed as the buffer (a bytearray: writable, no second copy);
        # a slice assignment per table cost ~2 us each
        raw = bytearray(b"".join(r.data + bytes(n - len(r.data)) for r, n in zip(self._pending, sizes)))
        buf = np.frombuffer(raw, np.uint8)
        self.append(buf)
        self.buffers.append(buf)
        base, at = buf.ctypes.data, 0
        ints = self._ints
        for ref, n in zip(self._pending, sizes):
            if ints is not None and id(ref) in ints:
                self.int_tables.append(buf[at:at + len(ref.data)].view(np.int64))
            ref.addr, ref.data = base + at, None
            at += n
        self._pending.clear()
        if ints is not None:
            ints.clear()

    def hold(self, a: np.ndarray) -> None:
        """Keep the buffer under a view (its last ndarray base), not the view: the view's own header is all it
        would add, and the plan needs only the memory it points into."""
        while isinstance(a.base, np.ndarray):
            a = a.base
        self.append(a)


def resolved(call: Any) -> Any:
    """`call` with the addresses of its sealed tables in place of their refs (any other call as it is)."""
    if isinstance(call, NativeCall) and any(isinstance(a, TableRef) for a in call.args):
        if any(isinstance(a, TableRef) and a.data is not None for a in call.args):
            raise RuntimeError("a native call reads a table of a plan that is not sealed")
        return NativeCall(call.fn, tuple(a.addr if isinstance(a, TableRef) else a for a in call.args))
    return call
