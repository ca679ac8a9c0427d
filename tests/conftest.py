"""Suite-wide rules.

Tests marked ``nsys`` need a real Nsight Systems CLI. On a developer machine without one they skip
with a reason; on CI (environment variable ``CI`` set, as .ci/run does) a skip would hide that the
real-nsys tests never ran, so there it is turned into a failure.
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
    if report.skipped and in_ci() and item.get_closest_marker("nsys") and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI is set, so tests marked nsys must run, but this one skipped: {reason}"
