"""The static C in codegen/csrc compiles cleanly under -Wall -Wextra -Werror, each file on its own, with OpenMP
(as every library builds) and with the libm variant of the prelude: a warning in a shipped header is a bug."""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

import pytest

from dynshape.codegen import cc

FILES = sorted(p.name for p in cc.CSRC.iterdir() if p.suffix == ".c")
STRICT = ["-Wall", "-Wextra", "-Werror"]


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("extra", [["-fopenmp"], ["-DDS_LIBM_MATH", "-fopenmp"]], ids=["omp", "libm"])
def test_static_c_compiles_with_warnings_as_errors(name: str, extra: list, tmp_path: Path) -> None:
    argv = [*cc.find_compiler(), *cc.DEFAULT_FLAGS, *STRICT, *extra, f"-I{cc.CSRC}"]
    if name == "ds_trampoline.c":
        argv.append(f"-I{sysconfig.get_paths()['include']}")
    proc = subprocess.run([*argv, str(cc.CSRC / name), "-o", str(tmp_path / "x.so")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_header_is_self_contained(tmp_path: Path) -> None:
    """Each header compiles alone (it includes what it uses), so include order never matters."""
    for h in sorted(p.name for p in cc.CSRC.iterdir() if p.suffix == ".h"):
        src = tmp_path / "one.c"
        src.write_text(f'#include "{h}"\nint ds_unused_symbol_for_{h[:-2]};\n')
        proc = subprocess.run([*cc.find_compiler(), *cc.DEFAULT_FLAGS, *STRICT, "-fopenmp", f"-I{cc.CSRC}",
                               str(src), "-o", str(tmp_path / "x.so")], capture_output=True, text=True)
        assert proc.returncode == 0, f"{h}: {proc.stderr}"


def test_a_header_change_is_a_new_build_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Builds #include csrc/ by path, so the cache key must hash the files' contents."""
    assert len(cc.csrc_digest()) == 64
    before = cc._cache_key("int x;", [], [], "gcc 12")
    monkeypatch.setattr(cc, "csrc_digest", lambda: "0" * 64)  # as if a header had changed
    assert cc._cache_key("int x;", [], [], "gcc 12") != before
