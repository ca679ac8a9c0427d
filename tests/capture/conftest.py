"""Fixtures for the capture tests: a fake nsys CLI (see fake_nsys.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture
def fake_nsys(tmp_path: Path) -> Path:
    """An executable ``nsys`` that runs fake_nsys.py with this interpreter."""
    exe = tmp_path / "bin" / "nsys"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'fake_nsys.py'} \"$@\"\n")
    exe.chmod(0o755)
    return exe
