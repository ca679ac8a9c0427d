"""Suite-wide rules.

Tests marked ``nsys`` need a real Nsight Systems CLI, tests marked ``installed`` need the suite to run
on the installed wheel (.ci/run). On a developer machine they skip with a reason; on CI (environment
variable ``CI`` set, as .ci/run does) a skip would hide that they never ran, so there it is turned
into a failure.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest


def in_ci() -> bool:
    """True when the environment variable CI is set to anything non-empty."""
    return bool(os.environ.get("CI"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and _must_run(item) and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI is set, so tests marked nsys or installed must run, but this one skipped: {reason}"


@pytest.fixture(autouse=True, scope="session")
def _private_export_cache(tmp_path_factory: pytest.TempPathFactory) -> Generator[None, None, None]:
    """Exports of .nsys-rep inputs go to $XDG_CACHE_HOME/perfdoctor: a test must not fill the user's."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg_cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


def _must_run(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in ("nsys", "installed"))
