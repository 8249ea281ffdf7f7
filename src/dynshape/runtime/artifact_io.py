"""How an artefact directory is written, replaced, read and signed, safely against concurrency, interruption and
tampering (the rules `artifact.save` / `artifact.load` follow).

- Replacing: a save builds into a private `.OUT.tmp-<pid>-*` beside OUT, then, holding an exclusive lock on the
  parent directory, swaps it into place: one atomic `renameat2(RENAME_EXCHANGE)` where the kernel has it, else
  the old artefact is renamed aside (`.OUT.old-<pid>-*`) before the new one is renamed in. At no instant is
  there neither artefact: a kill between the two renames leaves the old one aside, and the next save or load
  puts it back (`restore_interrupted`). Loads hold the same lock shared while they read, so they never see half
  of one artefact and half of another.
- Clean-up: temporary and aside directories whose owner process died are removed by the next save.
- Reading: every file is opened without following links and without blocking (a FIFO never hangs a load),
  must be a regular file, and small files have a size cap (`read_regular`).
- Trust: an artefact holds native code that `load` runs in this process. Its sha256 manifest catches damage, not
  an attacker who can write the directory (the hashes can be recomputed). Load only artefacts you built or
  received from someone you trust; with a key, `save(..., signing_key=K)` adds an HMAC-SHA256 of the manifest
  and `load(..., signing_key=K)` refuses an artefact whose signature is missing or wrong.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import hmac
import json
import os
import shutil
import stat
from pathlib import Path

from dynshape.codegen.cc import clean_stale, dir_lock, is_stale, owned_tmpdir
from dynshape.errors import DynshapeError

SIGNATURE_ALG = "hmac-sha256"
SMALL_FILE_LIMIT = 64 << 20  # manifest.json and config.json are a few KiB: anything above is not ours
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def tmp_prefix(out: Path) -> str:
    return f".{out.name}.tmp-"


def aside_prefix(out: Path) -> str:
    return f".{out.name}.old-"


def locked(parent: Path, shared: bool = False) -> contextlib.AbstractContextManager[None]:
    """An advisory lock on the directory that holds artefacts (exclusive to swap one in, shared to read one)."""
    return dir_lock(parent, shared)


def new_tmpdir(out: Path) -> Path:
    """The private directory a save builds into, after removing what interrupted saves left beside `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(out.parent):
        restore_interrupted(out)
        clean_stale(out.parent, tmp_prefix(out))
        clean_stale(out.parent, aside_prefix(out))
    return owned_tmpdir(out.parent, tmp_prefix(out))


def restore_interrupted(out: Path) -> bool:
    """Put back an artefact a killed save had renamed aside and not yet replaced (the caller holds the lock)."""
    if out.exists() or out.is_symlink():
        return False
    try:
        asides = sorted((p for p in out.parent.iterdir() if p.name.startswith(aside_prefix(out)) and p.is_dir()),
                        key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return False
    for aside in asides:
        if is_stale(aside) and (aside / "a").is_dir():  # swap_in's fallback keeps the old artefact at aside/a
            os.replace(aside / "a", out)
            shutil.rmtree(aside, ignore_errors=True)
            return True
    return False


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_in(tmp: Path, out: Path) -> None:
    """Make `tmp` the artefact at `out`, replacing any artefact there, without an instant where neither exists."""
    (tmp / ".owner").unlink(missing_ok=True)
    with locked(out.parent):
        restore_interrupted(out)
        if not out.exists():
            os.replace(tmp, out)
            return
        if out.is_symlink() or not out.is_dir():
            raise DynshapeError(f"{out} is not a directory; give a directory for the artefact")
        if _exchange(tmp, out):
            shutil.rmtree(tmp, ignore_errors=True)  # now the old artefact
            return
        aside = owned_tmpdir(out.parent, aside_prefix(out))
        os.replace(out, aside / "a")  # the old one, still whole, inside an owned (cleanable) directory
        os.replace(tmp, out)
        shutil.rmtree(aside, ignore_errors=True)


def read_regular(path: Path, what: str, hint: str, limit: int | None = None) -> bytes:
    """A file's bytes, refusing links, FIFOs, devices and (with `limit`) anything larger than it should be."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise DynshapeError(f"{what} is missing {path.name} (listed in its manifest); {hint}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DynshapeError(f"{what}: {path.name} is a symbolic link; an artefact holds regular files only: "
                                f"{hint}") from None
        raise DynshapeError(f"{what}: cannot open {path.name} ({e.strerror}); {hint}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DynshapeError(f"{what}: {path.name} is not a regular file (a FIFO, device or directory); an "
                                f"artefact holds regular files only: {hint}")
        if limit is not None and st.st_size > limit:
            raise DynshapeError(f"{what}: {path.name} is {st.st_size} bytes, far more than this file ever holds; "
                                f"{hint}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def check_tree(root: Path, what: str, hint: str) -> None:
    """No symbolic link, FIFO or device anywhere under the artefact: only directories and regular files."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in (*dirnames, *filenames):
            p = Path(dirpath) / name
            mode = p.lstat().st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                rel = p.relative_to(root).as_posix()
                raise DynshapeError(f"{what}: {rel} is not a regular file or directory (a link, FIFO or device); "
                                    f"refusing to load it: {hint}")


# ---- signing ------------------------------------------------------------------------------------------------
def _key_bytes(key: bytes | str) -> bytes:
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise DynshapeError("signing_key must be non-empty bytes or str")
    return bytes(key)


def _signed_payload(manifest: dict) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign(manifest: dict, key: bytes | str) -> dict:
    """The manifest with an HMAC-SHA256 over everything else in it (every file's sha256 included)."""
    mac = hmac.new(_key_bytes(key), _signed_payload(manifest), hashlib.sha256).hexdigest()
    return {**manifest, "signature": {"alg": SIGNATURE_ALG, "mac": mac}}


def verify_signature(manifest: dict, key: bytes | str, what: str) -> None:
    """Refuse an artefact that is unsigned or whose signature does not match `key`."""
    sig = manifest.get("signature")
    if not isinstance(sig, dict) or sig.get("alg") != SIGNATURE_ALG or not isinstance(sig.get("mac"), str):
        raise DynshapeError(f"{what} is not signed, and a signing key was given: refusing to load unsigned native "
                            "code; rebuild it with `ds.save(..., signing_key=...)` (or `dynshape compile "
                            "--signing-key-file`)")
    want = hmac.new(_key_bytes(key), _signed_payload(manifest), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, sig["mac"]):
        raise DynshapeError(f"{what}: its signature does not match the signing key (it was modified after signing, "
                            "or signed with another key); refusing to load it")
