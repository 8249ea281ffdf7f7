"""Suite-wide rules.

Under CI (`CI` set, as `.ci/run` runs), a test skipped because a package could not be imported fails instead:
`.ci/run` installs every extra a test covers, so such a skip means an install step is missing and the test it
guards silently stopped running (issue 28: the PyTorch frontend's 12 tests skipped in CI for months). Skips for
absent hardware or tools stay skips; their reasons name what is absent.

One store of built kernel libraries for the session (`_shared_builds`): the suite builds the same libraries many
times over, into private caches (a module's, a test's) and into every artefact it saves (`save` compiles every
native helper into the artefact's own libs/, ~15 s of gcc on 2 cores each time). A build whose cache entry name
(the library's sha256 key over source, flags, link arguments, compiler path and version, CPU and csrc/) the
session already compiled is copied from the store instead of compiled again: the same bytes the compiler would
write, published by the same code path (`cc._compile`'s lock, stale clean-up and checks run as before; only the
compiler run inside `_build_in` is skipped). Compiler failures are never stored; a test that swaps `_compile`
or sets CC to a wrapper of its own (a new compiler path: a new key) still sees every compile.
`pytest --cold-builds` turns the store off.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

_MISSING_PACKAGE = ("could not import", "No module named")


def _fail_missing_package_skip(report) -> None:
    if not os.environ.get("CI") or not report.skipped or not isinstance(report.longrepr, tuple):
        return
    reason = str(report.longrepr[2])
    if any(marker in reason for marker in _MISSING_PACKAGE):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI for a missing package ({reason}): add it to the extras .ci/run installs"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_missing_package_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module-level `pytest.importorskip` skips at collection, not in a test's report."""
    outcome = yield
    _fail_missing_package_skip(outcome.get_result())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cold-builds", action="store_true",
                     help="compile every kernel library each time a test builds it (no session store of builds)")


_BUILDS = {"compiled": 0, "copied": 0}


@pytest.fixture(scope="session", autouse=True)
def _shared_builds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """See the module's docstring. Session scope and autouse: in place before any module fixture builds."""
    if request.config.getoption("--cold-builds"):
        yield
        return
    from dynshape.codegen import cc

    store = tmp_path_factory.mktemp("shared-builds")
    real = cc._build_in
    lock = threading.Lock()

    def _publish(src: Path, dst: Path) -> None:
        """Copy then rename: a reader never sees half a file."""
        tmp = dst.with_name(f".tmp-{threading.get_ident()}-{dst.name}")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)

    def build_in(source, name, flags, link, cc_argv, dest: Path, work: Path) -> None:
        kept = store / dest.name
        kept_sum = Path(str(kept) + ".sha256")
        if kept_sum.is_file() and kept_sum.read_text().strip() == cc._file_sha256(kept):
            try:
                _publish(kept, dest)
                _publish(kept_sum, Path(str(dest) + ".sha256"))
                dest.with_suffix(".c").write_text(source)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            with lock:
                _BUILDS["copied"] += 1
            return
        real(source, name, flags, link, cc_argv, dest, work)
        _publish(dest, kept)
        _publish(Path(str(dest) + ".sha256"), kept_sum)  # last: the entry counts once its sidecar is there
        with lock:
            _BUILDS["compiled"] += 1

    mp = pytest.MonkeyPatch()
    mp.setattr(cc, "_build_in", build_in)
    yield
    mp.undo()


def pytest_terminal_summary(terminalreporter) -> None:
    if _BUILDS["copied"]:
        terminalreporter.write_line(f"kernel libraries: {_BUILDS['compiled']} compiled, {_BUILDS['copied']} copied "
                                    "from this session's builds (pytest --cold-builds: compile every time)")
