"""`clib.warm`: helper libraries compiled on another thread, once, in the order asked, into the cache given."""

from pathlib import Path

import pytest

from dynshape.codegen import cc, clib


def _fresh(name: str) -> clib.CLibrary:
    # a library object of its own (nothing loaded yet), built from a real csrc file
    return clib.CLibrary(name, "ds_resize.c", {"ds_resize2d_nhwc": (clib.P,)}, openmp=True)


@pytest.fixture
def libs(monkeypatch: pytest.MonkeyPatch) -> list[clib.CLibrary]:
    made = [_fresh("warm_test_a"), _fresh("warm_test_b")]
    monkeypatch.setattr(clib, "LIBRARIES", [*clib.LIBRARIES, *made])
    monkeypatch.setattr(clib, "_warming", set())
    return made


def _entries(where: Path) -> set[str]:
    return {p.name for p in where.rglob("*.so")}


def test_warm_builds_into_the_given_cache_once(libs: list[clib.CLibrary], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = libs
    order: list[str] = []
    load = clib.CLibrary.try_load
    monkeypatch.setattr(clib.CLibrary, "try_load", lambda self: order.append(self.name) or load(self))
    t = clib.warm(["warm_test_b", "no_such_library", "warm_test_a"], tmp_path)
    assert t is not None
    t.join(120)
    assert a._loaded and b._loaded and not isinstance(a._loaded[0], Exception)
    assert order == ["warm_test_b", "warm_test_a"]  # the order asked, not the order declared
    assert _entries(tmp_path)  # compiled into the directory asked for, not the default cache
    assert clib.warm(["warm_test_a", "warm_test_b"], tmp_path) is None  # each library at most once


def test_warm_compiles_nothing_offline(libs: list[clib.CLibrary], tmp_path: Path) -> None:
    with cc.offline("some-compiler"):
        assert clib.warm(["warm_test_a"], tmp_path) is None
    assert not libs[0]._loaded and not _entries(tmp_path)
    t = clib.warm(["warm_test_a"], tmp_path)  # refused offline, so not marked: warmed when allowed
    assert t is not None
    t.join(120)
    assert libs[0]._loaded


def test_warming_waits_while_a_build_compiles_its_own_kernels(libs: list[clib.CLibrary], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A build's own compiles go first: no helper library starts while one runs."""
    import threading
    import time

    started: list[float] = []
    monkeypatch.setattr(clib.CLibrary, "try_load", lambda self: started.append(time.perf_counter()))
    go = threading.Event()

    def build() -> None:
        with cc.foreground():
            go.set()
            time.sleep(0.5)
        ended.append(time.perf_counter())

    ended: list[float] = []
    b = threading.Thread(target=build)
    b.start()
    go.wait(5)
    t = clib.warm(["warm_test_a", "warm_test_b"], tmp_path)
    assert t is not None
    t.join(10)
    b.join(10)
    assert len(started) == 2 and ended and min(started) >= ended[0] - 0.01
