import ctypes
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from dynshape.codegen import cc
from dynshape.errors import DynshapeError


def _src(tag: str = "") -> str:
    """A fresh source each time, so no test sees another's cache entry or an already-loaded library."""
    return f"/* {tag} {uuid.uuid4().hex} */\nint add1(int x) {{ return x + 1; }}\n"


def _add1(lib: ctypes.CDLL) -> int:
    lib.add1.argtypes, lib.add1.restype = [ctypes.c_int], ctypes.c_int
    return lib.add1(41)


def test_compile_load_and_memory_cache() -> None:
    src = _src()
    lib = cc.compile_c(src, "add", symbols=["add1"])
    assert _add1(lib) == 42
    assert cc.compile_c(src, "add") is lib


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DYNSHAPE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cc.cache_dir() == tmp_path / "xdg" / "dynshape"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cc.cache_dir() == tmp_path / "home" / ".cache" / "dynshape"
    monkeypatch.setenv("DYNSHAPE_CACHE_DIR", str(tmp_path / "explicit"))
    assert cc.cache_dir() == tmp_path / "explicit"


def test_entry_layout_and_key_depends_on_flags() -> None:
    src = _src()
    so = cc.build_shared(src, "layout")
    assert so.exists() and Path(str(so) + ".sha256").exists() and so.with_suffix(".c").read_text() == src
    assert cc.build_shared(src, "layout", flags=[*cc.DEFAULT_FLAGS, "-O2"]) != so
    assert not [p for p in so.parent.iterdir() if p.name.startswith((".build-", ".tmp-"))]


def test_second_process_loads_without_compiling() -> None:
    src = _src()
    cc.build_shared(src, "warm")
    script = textwrap.dedent(
        f"""
        import ctypes
        from dynshape.codegen import cc
        def no_compile(*a, **k):
            raise AssertionError("compiled although the disk cache holds the library")
        cc._compile = no_compile
        lib = cc.compile_c({src!r}, "warm")
        lib.add1.argtypes, lib.add1.restype = [ctypes.c_int], ctypes.c_int
        print(lib.add1(1))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"


@pytest.mark.parametrize("damage", ["bytes", "sidecar", "consistent-garbage"])
def test_corrupt_entry_is_rebuilt(damage: str) -> None:
    src = _src(damage)
    so = cc.build_shared(src, "corrupt")
    good = so.read_bytes()
    sidecar = Path(str(so) + ".sha256")
    if damage == "bytes":  # truncated library, stale sidecar: hash mismatch
        so.write_bytes(good[: len(good) // 2])
    elif damage == "sidecar":  # sidecar lost: the entry was never published completely
        sidecar.unlink()
    else:  # garbage whose sidecar matches: only dlopen can tell
        import hashlib

        so.write_bytes(b"not an ELF file")
        sidecar.write_text(hashlib.sha256(b"not an ELF file").hexdigest() + "\n")
    assert _add1(cc.compile_c(src, "corrupt")) == 42
    assert so.read_bytes() != b"not an ELF file" and len(so.read_bytes()) > 1000


def test_concurrent_processes_share_one_entry(tmp_path: Path) -> None:
    src = _src("concurrent") + "int big(void) { return 7; }\n"
    script = (
        "import ctypes\nfrom dynshape.codegen import cc\n"
        f"lib = cc.compile_c({src!r}, 'race', symbols=['big'])\nprint(lib.big())\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert all(o.strip() == "7" for o, _ in outs)
    so = cc.build_shared(src, "race")
    leftovers = [p.name for p in so.parent.iterdir() if p.name.startswith((".build-", ".tmp-"))]
    assert leftovers == []


def test_compiler_error_names_kernel_and_shows_source() -> None:
    src = "int ok(void) { return 1; }\nint broken(int x) {\n    return x +;\n}\n"
    with pytest.raises(cc.CompileError) as ei:
        cc.compile_c(src, "my_kernel")
    msg = str(ei.value)
    assert "'my_kernel'" in msg and "error" in msg
    assert ">    3 |     return x +;" in msg
    assert isinstance(ei.value, DynshapeError)


def test_missing_symbol() -> None:
    with pytest.raises(cc.CompileError, match="does not export nope"):
        cc.compile_c(_src(), "sym", symbols=["add1", "nope"])


def _fake_cc(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fakecc"
    path.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'fakecc 0.1'; exit 0; fi\n" + body)
    path.chmod(0o755)
    return path


def test_fake_compiler_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_cc(
        tmp_path,
        'for a in "$@"; do case "$a" in *.c) src="$a";; esac; done\n'
        'echo "$src:2:7: error: the fake compiler refuses" >&2\nexit 1\n',
    )
    monkeypatch.setenv("CC", str(fake))
    src = "int a;\nint b = oops;\nint c;\n"
    with pytest.raises(cc.CompileError) as ei:
        cc.compile_c(src, "fake_kernel")
    msg = str(ei.value)
    assert "'fake_kernel'" in msg and "the fake compiler refuses" in msg
    assert ">    2 | int b = oops;" in msg and "     1 | int a;" in msg


def test_fake_compiler_silent_success_without_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(_fake_cc(tmp_path, "exit 0\n")))
    with pytest.raises(cc.CompileError, match="no compiler output"):
        cc.compile_c(_src(), "ghost")


def test_cc_not_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(DynshapeError, match="CC="):
        cc.compile_c(_src(), "x")


def test_no_compiler_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DynshapeError, match="apt-get install gcc"):
        cc.compile_c(_src(), "x")


def test_compile_extension() -> None:
    src = (
        "#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n"
        "static PyObject *answer(PyObject *s, PyObject *a) { (void)s; (void)a; return PyLong_FromLong(42); }\n"
        'static PyMethodDef m[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};\n'
        'static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, "ds_test_ext", NULL, -1, m};\n'
        "PyMODINIT_FUNC PyInit_ds_test_ext(void) { return PyModule_Create(&d); }\n"
    )
    mod = cc.compile_extension(src, "ds_test_ext")
    assert mod.answer() == 42
    assert cc.compile_extension(src, "ds_test_ext") is mod


def test_compile_extension_without_headers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cc.sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    with pytest.raises(cc.CompileError, match="python3-dev"):
        cc.compile_extension("int x;", "nothing")


def test_unwritable_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("DYNSHAPE_CACHE_DIR", str(blocker))
    with pytest.raises(cc.CompileError, match="DYNSHAPE_CACHE_DIR"):
        cc.compile_c(_src(), "x")


def test_a_build_into_another_directory_copies_the_default_caches_checked_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An artefact's save builds into its own libs/ (a pinned directory): an entry of the same name (the same key)
    in the default cache is copied, not compiled again; a damaged one is compiled, never copied."""
    src = _src("seed")
    home = cc.build_shared(src, "seed")  # the default cache (the suite's DYNSHAPE_CACHE_DIR)
    builds = []
    real = cc._build_in
    monkeypatch.setattr(cc, "_build_in", lambda *a: builds.append(a[-2]) or real(*a))
    with cc.pinned_cache_dir(tmp_path / "art"):
        copied = cc.build_shared(src, "seed")
    assert not builds and copied.parent.parent == tmp_path / "art" and copied.name == home.name
    assert copied.read_bytes() == home.read_bytes() and copied.with_suffix(".c").read_text() == src
    assert Path(str(copied) + ".sha256").read_text() == Path(str(home) + ".sha256").read_text()
    assert not [p for p in copied.parent.iterdir() if p.name.startswith(".tmp-")]
    data = bytearray(home.read_bytes())
    data[len(data) // 2] ^= 0xFF
    home.write_bytes(bytes(data))  # the default entry no longer matches its sidecar
    with cc.pinned_cache_dir(tmp_path / "art2"):
        rebuilt = cc.build_shared(src, "seed")
    assert builds == [rebuilt] and rebuilt.read_bytes() != bytes(data)


def test_libgomp_gets_a_spin_count_unless_the_user_chose_a_wait_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without it libgomp drops to 1,000 spins then futex sleeps once it counts more threads than CPUs (a second
    executable's team, a background build's): a 2-thread decoder step 78 -> 520 us (options.default_openmp_spin)."""
    from dynshape import options

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    options.default_openmp_spin()
    assert os.environ["GOMP_SPINCOUNT"] == str(options.OPENMP_SPIN)
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    options.default_openmp_spin()
    assert os.environ["GOMP_SPINCOUNT"] == "7"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    options.default_openmp_spin()
    assert "GOMP_SPINCOUNT" not in os.environ
