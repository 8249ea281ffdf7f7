"""Suite-wide rules.

Under CI (`CI` set, as `.ci/run` runs), a test skipped because a package could not be imported fails instead:
`.ci/run` installs every extra a test covers, so such a skip means an install step is missing and the test it
guards silently stopped running (issue 28: the PyTorch frontend's 12 tests skipped in CI for months). Skips for
absent hardware or tools stay skips; their reasons name what is absent.

`_private_cache`: every test builds into a private disk cache, never the user's ~/.cache/dynshape (suite-wide:
under pytest-xdist a worker may run the node suite's child processes before any other test set one).

`_shared_builds`: one store of built kernel libraries for the session (tests/shared_builds.py): a library the
session already compiled is copied, not compiled again. `pytest --cold-builds` turns it off.
"""

from __future__ import annotations

import os
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



@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory):
    """Session scope: in place before any module fixture compiles anything (and inherited by child processes)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DYNSHAPE_CACHE_DIR", str(tmp_path_factory.mktemp("dynshape-cache")))
        yield


@pytest.fixture(scope="session", autouse=True)
def _shared_builds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Session scope and autouse: in place before any module fixture builds. Yields the store (None with
    --cold-builds), which `build_store` hands to tests whose child processes build."""
    if request.config.getoption("--cold-builds"):
        yield None
        return
    import shared_builds

    store = tmp_path_factory.mktemp("shared-builds")
    undo = shared_builds.install(store)
    yield store
    undo()


@pytest.fixture
def build_store(_shared_builds) -> Path | None:
    """The session's store of built libraries, for a child process to `shared_builds.install` (None: off)."""
    return _shared_builds


def pytest_terminal_summary(terminalreporter) -> None:
    import sys

    counts = getattr(sys.modules.get("shared_builds"), "COUNTS", None)
    if counts and counts["copied"]:
        terminalreporter.write_line(f"kernel libraries: {counts['compiled']} compiled, {counts['copied']} copied "
                                    "from this session's builds (pytest --cold-builds: compile every time)")
