"""perfdoctor.blame.join builds each rank's whole path when needed instead of holding every rank's: the
paths followed across ranks must not depend on how many ranks' paths it keeps at once."""

from __future__ import annotations

from pathlib import Path

import perfdoctor.api as api
import perfdoctor.blame.join as join
from tests.paths import REPO

DLRM = REPO / "tests" / "data" / "traces" / "kineto" / "param_dlrm_8rank"


def _paths() -> dict:
    return api.analyze([Path(DLRM)], timeline_excerpts=False).path


def test_paths_across_ranks_do_not_depend_on_how_many_ranks_are_kept(monkeypatch) -> None:
    kept_all = _paths()
    followed = sum(1 for rank, entries in kept_all.items() for e in entries if str(e["rank"]) != rank)
    assert followed > 0  # the trace has waits followed onto the late rank's path: the cache is exercised
    monkeypatch.setattr(join, "ACROSS_CACHE", 1)  # every late rank's path rebuilt each time it is needed
    assert _paths() == kept_all
