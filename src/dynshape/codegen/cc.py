"""C compiler driver: C source -> shared library -> ctypes handle, with an in-process and an on-disk cache.

Why a disk cache: gcc -O3 costs 0.1-1 s per kernel; a second process (or a second run of the same model)
must load the library without compiling.  Entries are content-addressed by sha256 of everything that
changes the binary (source, flags, link args, compiler identity and version, CPU, since we build with
-march=native), written atomically (temp file + os.replace) so concurrent processes never see half a file,
and verified against a sha256 sidecar on load: a corrupt entry is rebuilt, never trusted.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import re
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
import threading
import time
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dynshape.codegen import cshared
from dynshape.errors import DynshapeError
from dynshape.options import compiler_command, default_cache_dir, default_openmp_spin

__all__ = [
    "DEFAULT_FLAGS",
    "CompileError",
    "build_shared",
    "cache_dir",
    "clean_stale",
    "dir_lock",
    "is_stale",
    "owned_tmpdir",
    "clear_memory_cache",
    "compile_c",
    "BuildContext",
    "adopt",
    "build_context",
    "compile_extension",
    "compiler_identity",
    "csrc_digest",
    "find_compiler",
    "include_flags",
    "is_offline",
    "machine_tag",
    "offline",
    "read_csrc",
]



def _wide_vectors() -> tuple[str, ...]:
    """On AVX-512 CPUs gcc still prefers 256-bit vectors; 512 measured 8-18% faster on gelu epilogues and
    1.2-1.4x on ds_erff loops (bench/codegen_poc.py's machine, a Sapphire Rapids-class Xeon)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ()
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        return ()
    return ("-mprefer-vector-width=512",) if " avx512f" in flags else ()


# gcc's GNU C modes already contract a*b+c into FMA (-ffp-contract=fast is the default outside ISO modes);
# -fno-math-errno lets sqrtf & co. vectorise.  No -ffast-math: it would break NaN/Inf semantics of ONNX ops.
# -fno-trapping-math: no code here reads or traps on floating-point exception flags, and without AVX-512's masked
# operations gcc refuses to if-convert a select whose arm computes (`x != x ? x : y`, `x < c ? 0 : p * s`, in
# every ds_expf / ds_erff / ds_tanhf and many epilogues) lest the unselected lane raise a flag: on an AVX2 CPU
# (AMD EPYC Zen 3) no loop calling them vectorised. Results are the same (no reassociation, NaN/Inf kept).
# -Wno-psabi: without AVX-512, every 64-byte vector (ds_simd.h's ds_v16) passed or returned by value draws GCC's
# note that the ABI changed in GCC 4.6; those are static inline helpers, never called across an ABI boundary, and
# the note (which a #pragma cannot silence) failed every -Werror build on an AVX2-only CPU (AMD EPYC, Zen 3).
DEFAULT_FLAGS: tuple[str, ...] = (
    "-O3", "-march=native", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math", "-Wno-psabi",
    *_wide_vectors(),
)
_FORMAT = "dynshape-cc-2"  # bump to invalidate every disk entry when the layout or key changes
CSRC = Path(__file__).resolve().parent / "csrc"  # the static C every build may #include (-I)
_COMPILE_TIMEOUT_S = 600

_lock = threading.Lock()
_build_locks: dict[str, threading.Lock] = {}
_loaded: dict[str, ctypes.CDLL] = {}
_modules: dict[str, types.ModuleType] = {}


class CompileError(DynshapeError):
    """The C compiler is missing or rejected a kernel."""


_pinned = threading.local()

# Compiles a caller is waiting for (a build's own kernels) go first: background warming waits for them to end
# before starting its next library, so on 2 cores the build's compiler processes are not sharing them with a
# third (a build's libraries are its critical path on a cold cache; a helper it needs it compiles itself).
_foreground = threading.Condition()
_foreground_n = 0


@contextlib.contextmanager
def foreground() -> Iterator[None]:
    """Mark the compiles inside as ones a caller waits for (see `wait_for_foreground`)."""
    global _foreground_n
    with _foreground:
        _foreground_n += 1
    try:
        yield
    finally:
        with _foreground:
            _foreground_n -= 1
            _foreground.notify_all()


def wait_for_foreground(timeout_s: float = 10.0) -> None:
    """Block while foreground compiles run (at most `timeout_s`, so background work is never starved)."""
    with _foreground:
        _foreground.wait_for(lambda: _foreground_n == 0, timeout=timeout_s)


@contextlib.contextmanager
def pinned_cache_dir(path: str | os.PathLike) -> Iterator[None]:
    """Builds in this thread (only) go to `path`: an artefact being saved gets exactly its own libraries, while a
    background build in another thread keeps writing to the cache it started with."""
    old = getattr(_pinned, "path", None)
    _pinned.path = Path(path)
    try:
        yield
    finally:
        _pinned.path = old


def cache_dir() -> Path:
    """Disk cache root: the thread's pinned directory, else the default (`options.default_cache_dir`)."""
    pinned = getattr(_pinned, "path", None)
    return pinned if pinned is not None else Path(default_cache_dir())


def find_compiler() -> list[str]:
    """The compiler command: $CC (may carry arguments, e.g. 'ccache gcc'), else cc, gcc or clang on PATH."""
    cc = compiler_command()
    if cc:
        argv = shlex.split(cc)
        exe = shutil.which(argv[0]) if argv else None
        if exe is None:
            raise CompileError(
                f"CC={cc!r} is not an executable C compiler; set CC to an installed one (e.g. CC=gcc) "
                "or unset it to use cc/gcc from PATH"
            )
        return [exe, *argv[1:]]
    for name in ("cc", "gcc", "clang"):
        exe = shutil.which(name)
        if exe:
            return [exe]
    raise CompileError(
        "no C compiler found (dynshape compiles kernels to native code): install one, e.g. "
        "`apt-get install gcc` (Debian/Ubuntu) or `dnf install gcc`, or set CC=/path/to/compiler"
    )


@functools.cache
def _compiler_identity(argv: tuple[str, ...]) -> str:
    """Path + full `--version` text: a compiler upgrade must miss the cache."""
    try:
        proc = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise CompileError(f"cannot run the C compiler {' '.join(argv)}: {e}; install gcc or set CC") from e
    return " ".join(argv) + "\n" + proc.stdout + proc.stderr


@functools.cache
def machine_tag() -> str:
    """Arch plus CPU model/flags: -march=native binaries must not reach an older CPU via a shared cache."""
    tag = platform.machine()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return tag + " " + platform.processor()
    keep = [ln for ln in text.splitlines() if ln.split(":")[0].strip() in ("model name", "flags", "Features")]
    return tag + "\n" + "\n".join(sorted(set(keep)))


@functools.cache
def csrc_digest() -> str:
    """sha256 over every file in csrc/: a source that #includes one of them is a different build when it changes
    (ds_shared.h, generated, enters the key by cshared.DIGEST)."""
    h = hashlib.sha256()
    for f in sorted(CSRC.iterdir()):
        if f.suffix in (".c", ".h"):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def include_flags() -> list[str]:
    """The include path of every build: csrc/ and the generated ds_shared.h's directory (codegen/cshared.py)."""
    return [f"-I{CSRC}", f"-I{cshared.include_dir()}"]


def read_csrc(name: str) -> str:
    """The text of one static C file (a library's whole source, compiled with csrc/ on the include path)."""
    return (CSRC / name).read_text()


def _cache_key(source: str, flags: Sequence[str], link: Sequence[str], ident: str) -> str:
    h = hashlib.sha256()
    for part in (_FORMAT, source, "\0".join(flags), "\0".join(link), ident, machine_tag(), csrc_digest(),
                 cshared.DIGEST):
        h.update(part.encode())
        h.update(b"\0\1\0")
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _entry_ok(so: Path) -> bool:
    """An entry is trusted only if its sidecar names exactly the bytes on disk."""
    try:
        return Path(str(so) + ".sha256").read_text().strip() == _file_sha256(so)
    except OSError:
        return False


def _source_excerpt(source: str, stderr: str, src_name: str, context: int = 3) -> str:
    """Numbered source lines around the first error the compiler reports for our file."""
    m = re.search(rf"{re.escape(src_name)}:(\d+)(?::\d+)?:\s*(?:fatal )?error", stderr)
    if not m:
        return ""
    line = int(m.group(1))
    lines = source.splitlines()
    lo, hi = max(1, line - context), min(len(lines), line + context)
    return "\n".join(f"{'>' if i == line else ' '}{i:5d} | {lines[i - 1]}" for i in range(lo, hi + 1))


# ---- private work directories and their clean-up -------------------------------------------------------------
_OWNER = ".owner"
_STALE_UNOWNED_S = 3600.0  # a work directory without an owner file (its maker died at once): stale after an hour


def owned_tmpdir(parent: Path, prefix: str) -> Path:
    """A fresh private directory `parent/<prefix><pid>-<random>` recording its owner (host and pid), so a later
    build can tell it from one in progress and remove it once its owner is dead (`clean_stale`)."""
    work = Path(tempfile.mkdtemp(dir=parent, prefix=f"{prefix}{os.getpid()}-"))
    try:
        (work / _OWNER).write_text(f"{platform.node()} {os.getpid()}\n")
    except OSError:
        pass
    return work


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists, owned by another user
    return True


def is_stale(work: Path) -> bool:
    """Whether an owned work directory's owner is gone: a dead pid on this host, or no owner file for an hour."""
    try:
        host, pid = (work / _OWNER).read_text().split()
    except (OSError, ValueError):
        try:
            return time.time() - work.lstat().st_mtime > _STALE_UNOWNED_S
        except OSError:
            return False
    if host != platform.node() or not pid.isdigit():
        return False  # another machine's (a shared file system): never ours to judge
    return not _alive(int(pid))


@contextlib.contextmanager
def dir_lock(path: Path, shared: bool = False) -> Iterator[None]:
    """An advisory lock (flock) on a directory, across processes: builds into one cache shard, and saves and
    loads of the artefacts in one folder, take it. A no-op where flock is missing or the directory cannot be
    opened (nothing to protect there yet)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def clean_stale(parent: Path, prefix: str) -> list[Path]:
    """Remove the work directories under `parent` named `prefix*` whose owner died (an interrupted build or save
    leaves them behind); returns what was removed."""
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for work in entries:
        if work.name.startswith(prefix) and work.is_dir() and not work.is_symlink() and is_stale(work):
            shutil.rmtree(work, ignore_errors=True)
            removed.append(work)
    return removed


def _compile(
    source: str, name: str, flags: Sequence[str], link: Sequence[str], cc: list[str], dest: Path
) -> None:
    """Compile in a private temp dir next to dest, then publish .so, sidecar and source with os.replace.

    Under a lock on the cache shard (other processes building into it wait, then find the library built); work
    directories and temporary files that interrupted builds left (their process is dead) are removed first."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CompileError(
            f"cannot write the kernel cache at {dest.parent}: {e}; set DYNSHAPE_CACHE_DIR to a writable directory"
        ) from e
    with dir_lock(dest.parent):
        if _entry_ok(dest):  # another process built it while this one waited
            return
        clean_stale(dest.parent, ".build-")
        _clean_stale_files(dest.parent, ".tmp-")
        if _seed_from_default_cache(dest, source):
            return
        try:
            work = owned_tmpdir(dest.parent, ".build-")
        except OSError as e:
            raise CompileError(f"cannot write the kernel cache at {dest.parent}: {e}; set DYNSHAPE_CACHE_DIR to a "
                               "writable directory") from e
        _build_in(source, name, flags, link, cc, dest, work)


def _seed_from_default_cache(dest: Path, source: str) -> bool:
    """A build into another directory (an artefact's libs/ being saved) copies the default cache's entry of the
    same name when that entry checks: the name is the sha256 key over source, flags, compiler and CPU, so these are
    the bytes the compiler would write. Every save compiled all native helpers from scratch (~7 s of gcc on 2
    cores) though the user's cache held them. The copy is checked against the sidecar before it is published;
    anything amiss (missing, damaged, changed meanwhile) and the caller compiles as before."""
    seed = Path(default_cache_dir()) / dest.parent.name / dest.name
    tmp = dest.with_name(f".tmp-seed-{os.getpid()}-{threading.get_ident()}-{dest.name}")
    try:
        if seed.resolve() == dest.resolve() or not _entry_ok(seed):
            return False
        digest = Path(str(seed) + ".sha256").read_text().strip()
        shutil.copyfile(seed, tmp)
        if _file_sha256(tmp) != digest:
            return False
        os.replace(tmp, dest)
        _atomic_write(Path(str(dest) + ".sha256"), (digest + "\n").encode())
        _atomic_write(dest.with_suffix(".c"), source.encode())  # as a build leaves it: for debugging, never read
        return True
    except OSError:
        return False
    finally:
        tmp.unlink(missing_ok=True)  # a copy not published (after os.replace there is none)


def _clean_stale_files(parent: Path, prefix: str) -> None:
    """Temporary files (`_atomic_write`'s) an interrupted write left, an hour old or more."""
    now = time.time()
    for f in parent.glob(prefix + "*"):
        try:
            if f.is_file() and now - f.lstat().st_mtime > _STALE_UNOWNED_S:
                f.unlink()
        except OSError:
            pass


def _build_in(source: str, name: str, flags: Sequence[str], link: Sequence[str], cc: list[str], dest: Path,
              work: Path) -> None:
    try:
        src = work / f"{name}.c"
        src.write_text(source)
        out = work / f"{name}.so"
        argv = [*cc, *flags, str(src), "-o", str(out), *link]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S)
        except OSError as e:
            raise CompileError(f"cannot run the C compiler {cc[0]}: {e}; install gcc or set CC") from e
        except subprocess.TimeoutExpired as e:
            raise CompileError(f"compiling kernel {name!r} took over {_COMPILE_TIMEOUT_S} s") from e
        if proc.returncode != 0 or not out.exists():
            msg = (proc.stderr + proc.stdout).replace(str(work) + os.sep, "").strip()
            excerpt = _source_excerpt(source, msg, src.name)
            parts = [f"C compiler failed on kernel {name!r} (exit {proc.returncode}): {shlex.join(argv)}"]
            parts.append(msg[-4000:] or "(no compiler output)")
            if excerpt:
                parts.append(f"source around the error:\n{excerpt}")
            raise CompileError("\n".join(parts))
        digest = _file_sha256(out)
        os.replace(out, dest)
        _atomic_write(Path(str(dest) + ".sha256"), (digest + "\n").encode())
        os.replace(src, dest.with_suffix(".c"))  # kept for debugging generated code; never read back
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)[:48] or "kernel"


@contextlib.contextmanager
def offline(identity: str) -> Iterator[None]:
    """Builds in this thread only load (an artefact being loaded): cache keys use `identity`, the compiler the
    libraries were built with, so no compiler is looked for or run; a library not in the cache is a
    CompileError instead of a compilation."""
    old = getattr(_pinned, "identity", None)
    _pinned.identity = identity
    try:
        yield
    finally:
        _pinned.identity = old


def is_offline() -> bool:
    return getattr(_pinned, "identity", None) is not None


@dataclass(frozen=True)
class BuildContext:
    """Where this thread builds and whether it only loads: what a worker thread must adopt to build for it."""

    cache: Path
    identity: str | None


def build_context() -> BuildContext:
    return BuildContext(cache_dir(), getattr(_pinned, "identity", None))


@contextlib.contextmanager
def adopt(ctx: BuildContext) -> Iterator[None]:
    """Build in this (worker) thread as the thread that made `ctx` would."""
    with pinned_cache_dir(ctx.cache):
        if ctx.identity is None:
            yield
        else:
            with offline(ctx.identity):
                yield


def compiler_identity() -> str:
    """The identity of the compiler builds use here (raises CompileError without one)."""
    return _compiler_identity(tuple(find_compiler()))


def _plan(
    source: str, name: str, flags: Sequence[str], openmp: bool, link: Sequence[str]
) -> tuple[Path, list[str], list[str]]:
    """Cache path, compiler argv (empty when offline) and final flags of one build."""
    ident = getattr(_pinned, "identity", None)
    cc = [] if ident is not None else find_compiler()
    flags = [*flags, "-fopenmp"] if openmp else list(flags)
    key = _cache_key(source, flags, link, ident if ident is not None else _compiler_identity(tuple(cc)))
    # csrc/ and the generated ds_shared.h enter the key by content (csrc_digest, cshared.DIGEST), not by where they
    # are
    return cache_dir() / key[:2] / f"{name}-{key[:40]}.so", cc, [*flags, *include_flags()]


def _need_build(source: str, name: str, flags: Sequence[str], link: Sequence[str], cc: list[str],
                so: Path) -> None:
    if not cc:
        raise CompileError(f"kernel {name!r} is not in the build cache {so.parent.parent} and this thread only "
                           "loads (an artefact must ship every library it uses): rebuild the artefact")
    _compile(source, name, flags, link, cc, so)


def build_shared(
    source: str,
    name: str = "kernel",
    *,
    flags: Sequence[str] = DEFAULT_FLAGS,
    openmp: bool = False,
    link: Sequence[str] = (),
) -> Path:
    """Path of a verified shared library built from `source`, compiling only on a disk-cache miss.

    `flags` go before the source, `link` after it (-l/-L/-Wl, must follow the object files).
    """
    name = _safe_name(name)
    so, cc, flags = _plan(source, name, flags, openmp, link)
    if not _entry_ok(so):
        _need_build(source, name, flags, link, cc, so)
    return so


def compile_c(
    source: str,
    name: str = "kernel",
    *,
    flags: Sequence[str] = DEFAULT_FLAGS,
    openmp: bool = False,
    link: Sequence[str] = (),
    symbols: Sequence[str] = (),
    share: bool = False,
) -> ctypes.CDLL:
    """Compile (or fetch from cache) and load `source`; one load per process per distinct build.

    `symbols`: functions the library must export; a missing one is a CompileError naming the kernel.
    `share`: load with RTLD_GLOBAL, so libraries loaded later resolve their undeclared functions here.
    """
    name = _safe_name(name)
    so, cc, all_flags = _plan(source, name, flags, openmp, link)
    with _lock:  # one lock per library: different libraries compile at the same time
        lock = _build_locks.setdefault(str(so), threading.Lock())
    with lock:
        lib = _loaded.get(str(so))
        if lib is None:
            for attempt in (0, 1):
                if not _entry_ok(so):
                    _need_build(source, name, all_flags, link, cc, so)
                try:
                    default_openmp_spin()  # before the first library brings libgomp in
                    lib = ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL if share else ctypes.DEFAULT_MODE)
                    break
                except OSError as e:
                    # Verified bytes that still fail to load: rebuild once, never trust the entry.
                    Path(str(so) + ".sha256").unlink(missing_ok=True)
                    if attempt or not cc:
                        raise CompileError(f"kernel {name!r} compiled but cannot be loaded: {e}") from e
            _loaded[str(so)] = lib
    missing = [s for s in symbols if not hasattr(lib, s)]
    if missing:
        raise CompileError(f"kernel {name!r} does not export {', '.join(missing)}")
    return lib


def compile_extension(source: str, module: str, *, flags: Sequence[str] = DEFAULT_FLAGS) -> types.ModuleType:
    """Build and import a CPython extension module (source defines PyInit_<module>).

    Why: ctypes costs about 0.5-1 us per call plus 1-2 us per array to read its address; a METH_FASTCALL
    function reading arrays through the buffer protocol costs about 0.2 us for the whole call
    (bench/codegen_poc.py).  Needs Python's headers (python3-dev).
    """
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").exists():
        raise CompileError(
            f"Python.h not found in {include}: install Python's development headers "
            "(e.g. `apt-get install python3-dev`) to build dynshape's native call path"
        )
    so = build_shared(source, module, flags=[*flags, f"-I{include}"])
    with _lock:
        mod = _modules.get(str(so))
        if mod is None:
            loader = importlib.machinery.ExtensionFileLoader(module, str(so))
            spec = importlib.util.spec_from_file_location(module, str(so), loader=loader)
            if spec is None:  # pragma: no cover - only for a path importlib cannot handle
                raise CompileError(f"cannot import extension {module!r} from {so}")
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
            _modules[str(so)] = mod
    return mod


def clear_memory_cache() -> None:
    """Forget loaded libraries (tests); the OS keeps them mapped, the disk cache is untouched."""
    with _lock:
        _loaded.clear()
        _modules.clear()
