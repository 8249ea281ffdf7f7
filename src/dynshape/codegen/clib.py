"""The helper libraries built from the static C in csrc/: one `CLibrary` per file, loaded once per process.

Each names its source file, the entry points it must export and their ctypes signatures, so the Python side
of a library is one declaration. Artefacts ship every library in `LIBRARIES` (built into their libs/ when
saved, loaded from there, never compiled, when loaded).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dynshape.codegen.cc import (
    DEFAULT_FLAGS,
    CompileError,
    adopt,
    build_context,
    build_shared,
    compile_c,
    is_offline,
    pinned_cache_dir,
    read_csrc,
    wait_for_foreground,
)

P, I64, F32, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


@dataclass(frozen=True, eq=False)
class CLibrary:
    name: str
    source: str  # file in csrc/
    signatures: dict[str, tuple]  # entry point -> argtypes (restype void)
    openmp: bool = False
    share: bool = False  # symbols global: libraries loaded later (generated kernels) resolve calls here
    flags: tuple[str, ...] = ()
    needs: tuple[CLibrary, ...] = ()  # libraries whose symbols this one calls: loaded first (share=True)
    restypes: dict[str, object] = field(default_factory=dict)  # entry points that return something
    _loaded: list = field(default_factory=list, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def spec(self) -> dict:
        """The arguments of `cc.compile_c` that build this library."""
        return {"source": read_csrc(self.source), "name": self.name, "flags": (*DEFAULT_FLAGS, *self.flags),
                "openmp": self.openmp, "share": self.share, "symbols": list(self.signatures)}

    def load(self) -> ctypes.CDLL:
        """Compile (or fetch from the build cache) and load, once; every entry point gets its signature.
        A failure is remembered: without a compiler every later call raises the same CompileError at once."""
        loaded = self._loaded  # (set once, under the lock, its dependencies loaded first: read without it)
        if loaded and not isinstance(loaded[0], CompileError):
            return loaded[0]
        for dep in self.needs:
            dep.load()
        with self._lock:
            if not self._loaded:
                try:
                    lib = compile_c(**self.spec())
                except CompileError as e:
                    self._loaded.append(e)
                    raise
                for fn, argtypes in self.signatures.items():
                    f = getattr(lib, fn)
                    f.argtypes, f.restype = list(argtypes), self.restypes.get(fn)
                self._loaded.append(lib)
            got = self._loaded[0]
        if isinstance(got, CompileError):
            raise got
        return got

    def try_load(self) -> ctypes.CDLL | None:
        """`load()`, or None without a working C compiler (callers then take their numpy path)."""
        try:
            return self.load()
        except CompileError:
            return None

    def __hash__(self) -> int:
        return id(self)


LIBRARIES: list[CLibrary] = []


def declare(name: str, source: str, signatures: dict[str, tuple], **kw) -> CLibrary:
    """Declare a helper library (each module that wraps one calls this once, beside its Python side)."""
    lib = CLibrary(name, source, signatures, **kw)
    LIBRARIES.append(lib)
    return lib


def build_all() -> None:
    """Compile (or fetch) every declared library into the current cache directory, two at a time, the longest first
    (gcc runs outside the GIL: an artefact's save compiled its dozen static libraries one after another, most of a
    cold save); silent without a compiler. Nothing is loaded here: `load_all` loads them in their declared order,
    each after the libraries whose symbols it needs."""
    ctx = build_context()

    def build(lib: CLibrary) -> None:
        spec = lib.spec()
        with adopt(ctx):
            build_shared(spec["source"], spec["name"], flags=spec["flags"], openmp=spec["openmp"])

    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(build, sorted(LIBRARIES, key=lambda lib: -len(lib.spec()["source"]))))
    except CompileError:
        return


_warming: set[str] = set()
_warming_lock = threading.Lock()


def warm(names: Iterable[str], where: os.PathLike) -> threading.Thread | None:
    """Compile (or fetch) and load the named libraries, in the order given, on another thread, each at most once
    per process.

    Why: from a cold cache gcc takes 0.1-2 s per library; started early (when an executable is created, or when
    the torch backend receives Dynamo's graph, before aot_autograd's trace) the compiler runs on the other core
    while Python traces, instead of after it. A caller that needs a library first simply waits on its lock; a
    build compiling its own kernels goes first (each library here starts only when none is compiling)."""
    if is_offline():  # a loaded artefact loads its own libraries, compiling nothing
        return None
    by_name = {lib.name: lib for lib in LIBRARIES}
    with _warming_lock:
        todo = [by_name[n] for n in dict.fromkeys(names) if n in by_name and n not in _warming]  # in the given order
        _warming.update(lib.name for lib in todo)
    if not todo:
        return None

    def run() -> None:
        with pinned_cache_dir(where):
            for lib in todo:
                wait_for_foreground()
                lib.try_load()

    t = threading.Thread(target=run, daemon=True, name="dynshape-helpers")
    t.start()
    return t


def load_all() -> None:
    """Load every declared library into this process now (an artefact being loaded: from its libs/)."""
    for lib in LIBRARIES:
        lib.try_load()
