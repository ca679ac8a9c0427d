"""Suite-wide rules.

Tests marked ``nsys`` need a real Nsight Systems CLI, tests marked ``installed`` need the suite to run
on the installed wheel (.ci/run). On a developer machine they skip with a reason; on CI (environment
variable ``CI`` set, as .ci/run does) a skip would hide that they never ran, so there it is turned
into a failure.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Generator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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


class _OutsideReads:
    """Files a test opened beside the checkout: inside the checkout's parent folder, outside the checkout.

    A clone has nothing beside it (no project folder, no other checkout), so a test that reads there passes
    only on one machine. An audit hook sees every ``open`` of this process; paths are compared as written
    (absolute, ``..`` folded), without a system call per open. Where the checkout's parent is the root or
    the temporary folder, "beside" would be everything, so nothing is watched there. The temporary folder,
    the Python installation and the user's cache are not "beside" even when they lie in that parent.
    """

    def __init__(self, repo: Path) -> None:
        parent = os.path.abspath(repo.parent)
        tmp = os.path.abspath(tempfile.gettempdir())
        self.parent = None if parent in ("/", tmp) else parent + os.sep
        self.inside = [os.path.abspath(p) + os.sep for p in
                       (repo, tmp, sys.prefix, sys.base_prefix, sys.exec_prefix, Path.home() / ".cache")]
        self.seen: list[str] = []

    def __call__(self, event: str, args: tuple) -> None:
        if event != "open" or self.parent is None or not isinstance(args[0], (str, os.PathLike)):
            return
        path = os.path.abspath(os.fspath(args[0]))
        if path.startswith(self.parent) and not any(path.startswith(p) for p in self.inside):
            self.seen.append(path)


OUTSIDE_READS = _OutsideReads(REPO)
sys.addaudithook(OUTSIDE_READS)


@pytest.fixture(autouse=True)
def _reads_stay_inside_the_repository() -> Generator[None, None, None]:
    """Fails a test that opened a file beside the checkout (see _OutsideReads)."""
    del OUTSIDE_READS.seen[:]
    yield
    seen, OUTSIDE_READS.seen[:] = list(OUTSIDE_READS.seen), []
    assert not seen, f"read outside the repository {REPO}: {sorted(set(seen))[:5]}"


def _must_run(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in ("nsys", "installed"))
