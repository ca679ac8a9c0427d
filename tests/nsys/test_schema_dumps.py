"""tests/nsys/ddl/ holds what each release's exporter really writes (tests/test_loader_ddl.py builds on it)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.nsys.conftest import RELEASES

pytestmark = pytest.mark.nsys

DDL = Path(__file__).resolve().parent / "ddl"
DUMPS = {"2022.4": "schema_2022.4.2.sql", "2023.4": "schema_2023.4.4.sql", "2024.2": "schema_2024.2.3.sql"}


def table_shapes(conn: sqlite3.Connection) -> dict[str, list[tuple[str, str, int, int]]]:
    """Every table's columns in order: (name, declared type, NOT NULL, primary key position)."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {t: [(r[1], r[2], r[3], r[5]) for r in conn.execute(f"PRAGMA table_info([{t}])")] for t in tables}


@pytest.mark.parametrize("release", RELEASES)
def test_dump_matches_a_full_export(release: str, export_of: Callable[[str, bool], Path]) -> None:
    dumped = sqlite3.connect(":memory:")
    dumped.executescript((DDL / DUMPS[release]).read_text())
    exported = sqlite3.connect(export_of(release, False))
    assert table_shapes(exported) == table_shapes(dumped)
