"""Codegen fixtures: which native bf16 path a test takes (`tile_path`), which native entries a binder or the row
kernels' caller looked up (`spy_native`, `spy_row_kernels`). The private build cache is suite-wide
(tests/conftest.py)."""

from types import ModuleType, SimpleNamespace

import pytest

from dynshape.codegen import bf16, program


@pytest.fixture
def spy_native(monkeypatch: pytest.MonkeyPatch):
    """spy(module, entry): the names of `entry` looked up in the program library by `module`'s binders, one per
    lookup, so a test sees that a native path was bound, not just that the results are right (the reference gives
    the same values)."""

    def spy(module: ModuleType, entry: str) -> list:
        got: list = []
        lib = program.LIBRARY.load()

        class Proxy:
            def __getattr__(self, name: str):
                if name == entry:
                    got.append(name)
                return getattr(lib, name)

        monkeypatch.setattr(module, "program", SimpleNamespace(LIBRARY=SimpleNamespace(try_load=lambda: Proxy())))
        return got

    return spy


@pytest.fixture
def spy_row_kernels(monkeypatch: pytest.MonkeyPatch) -> list:
    """The names of the row-kernel entry points (codegen/row_kernels.py) the binds take, in order; none when every
    bind fell back to numpy."""
    from dynshape.codegen import row_kernels

    used: list = []
    lib = row_kernels.library()

    class Proxy:
        def __getattr__(self, name: str):
            used.append(name)
            return getattr(lib, name)

    monkeypatch.setattr(row_kernels, "library", lambda: Proxy())
    return used


@pytest.fixture
def tile_path():
    """Set which native path bf16 products take (0: VDPBF16PS, 1: AMX tiles) for one test; AMX again after (both
    paths tested on an AMX machine). Without the native library (no AVX512-BF16: an AVX2 CPU) there is no path
    to set and setting one does nothing, so a test that also checks the emulated path still runs there."""
    lib = bf16.LIBRARY.load() if bf16.native_available() else None
    yield lambda amx: None if lib is None else lib.ds_bf16_use_amx(amx)
    if lib is not None:
        lib.ds_bf16_use_amx(1)
