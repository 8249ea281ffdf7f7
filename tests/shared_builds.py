"""A store of built kernel libraries shared by the test session (and child processes it starts), so the suite
compiles each distinct library once.

Why: the suite builds the same libraries many times over, into private caches (a module's, a test's) and into
every artefact it saves (`save` compiles every native helper into the artefact's own libs/, ~15 s of gcc on 2
cores each time). `install(store)` wraps `cc._build_in`, the step of `cc._compile` that runs the compiler: a
library whose cache entry name (its sha256 key over source, flags, link arguments, compiler path and version, CPU
and csrc/) is in the store is copied from there, the bytes the compiler would write, published by the same code
path (`_compile`'s lock, stale clean-up and entry checks run as before). A damaged entry is compiled again, a
compiler failure is never stored, and a test that swaps `_compile` or sets CC to a wrapper of its own (a new
compiler path: a new key) still sees every compile. Imported by name (tests/ has no packages): tests/conftest.py
installs it for the session.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from dynshape.codegen import cc

COUNTS = {"compiled": 0, "copied": 0}
_lock = threading.Lock()


def _publish(src: Path, dst: Path) -> None:
    """Copy then rename: a reader never sees half a file."""
    tmp = dst.with_name(f".tmp-{os.getpid()}-{threading.get_ident()}-{dst.name}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _stored(kept: Path) -> bool:
    side = Path(str(kept) + ".sha256")
    try:
        return side.read_text().strip() == cc._file_sha256(kept)
    except OSError:
        return False


def install(store: str | os.PathLike) -> Callable[[], None]:
    """Route this process's compiles through `store`; returns the function that restores `cc._build_in`."""
    store = Path(store)
    real = cc._build_in

    def build_in(source, name, flags, link, cc_argv, dest: Path, work: Path) -> None:
        kept = store / dest.name
        if _stored(kept) and not dest.exists():  # an entry there failed its checks: compile it again, as asked
            try:
                _publish(kept, dest)
                _publish(Path(str(kept) + ".sha256"), Path(str(dest) + ".sha256"))
                dest.with_suffix(".c").write_text(source)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            with _lock:
                COUNTS["copied"] += 1
            return
        real(source, name, flags, link, cc_argv, dest, work)
        _publish(dest, kept)
        _publish(Path(str(dest) + ".sha256"), Path(str(kept) + ".sha256"))  # last: the entry counts once it is there
        with _lock:
            COUNTS["compiled"] += 1

    cc._build_in = build_in

    def undo() -> None:
        cc._build_in = real

    return undo
