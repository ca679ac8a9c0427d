"""`pip install .` must ship every module, the rule catalog and the package data (not only editable installs)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.paths import REPO


def test_wheel_holds_everything(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("perfdoctor-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"perfdoctor/{p.relative_to(REPO / 'perfdoctor').as_posix()}"
                for p in (REPO / "perfdoctor").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    expected |= {f"perfdoctor/rules/{p.name}" for p in (REPO / "rules").iterdir() if p.suffix in (".yaml", ".md")}
    missing = sorted(expected - names)
    assert not missing, missing
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "perfdoctor = perfdoctor.cli:main" in entry


def test_wheel_ships_the_parsed_rule_catalog(tmp_path):
    """catalog.json (written by setup.py) holds every shipped rule as its YAML parses, with the checksum
    that perfdoctor.diagnose.rules compares before trusting an entry."""
    import json
    import zlib

    import yaml

    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("perfdoctor-*.whl")
    catalog = json.loads(zipfile.ZipFile(wheel).read("perfdoctor/rules/catalog.json"))
    files = sorted((REPO / "rules").glob("*.yaml"))
    assert sorted(catalog) == [f.name for f in files]
    for f in files:
        raw = f.read_bytes()
        assert catalog[f.name]["crc32"] == zlib.crc32(raw)
        assert catalog[f.name]["spec"] == yaml.safe_load(raw.decode())
