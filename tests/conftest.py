"""Suite-wide rules.

Under CI (`CI` set, as `.ci/run` runs), a test skipped because a package could not be imported fails instead:
`.ci/run` installs every extra a test covers, so such a skip means an install step is missing and the test it
guards silently stopped running (issue 28: the PyTorch frontend's 12 tests skipped in CI for months). Skips for
absent hardware or tools stay skips; their reasons name what is absent.
"""

from __future__ import annotations

import os

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
