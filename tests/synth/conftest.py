"""Shared fixture: every packaged scenario simulated once per test session."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from perfdoctor.synth import run_scenario


def scenario_paths() -> list[Path]:
    return sorted(Path(str(resources.files("perfdoctor.synth").joinpath("scenarios"))).glob("*.yaml"))


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Scenario name -> written SQLite paths."""
    root = tmp_path_factory.mktemp("synth")
    return {p.stem: run_scenario(p, root / p.stem) for p in scenario_paths()}
