"""The build-time rule catalog (catalog.json, written by setup.py) is a cache of the YAML: an entry is
used only while its file has the checksum recorded with it, and a catalog gives the same rules as the
YAML files themselves."""

from __future__ import annotations

import json
import zlib

import yaml

from perfdoctor import safe_yaml
from perfdoctor.diagnose import rules as rules_module
from perfdoctor.diagnose.rules import CATALOG, builtin_dir, load_rule, load_rules


def _one_rule():
    return sorted(f for f in builtin_dir().iterdir() if f.name.endswith(".yaml"))[0]


def test_an_entry_is_used_while_its_file_is_unchanged() -> None:
    path = _one_rule()
    raw = path.read_bytes()
    spec = yaml.safe_load(raw.decode())
    marked = {**spec, "title": "from the catalog"}
    catalog = {path.name: {"crc32": zlib.crc32(raw), "spec": marked}}
    assert load_rule(path, True, schema_checked=True, parsed=catalog).title == "from the catalog"


def test_a_stale_entry_is_ignored_and_the_yaml_parsed() -> None:
    path = _one_rule()
    raw = path.read_bytes()
    stale = {path.name: {"crc32": zlib.crc32(raw) ^ 1, "spec": {"title": "stale"}}}
    assert load_rule(path, True, schema_checked=True, parsed=stale).spec == yaml.safe_load(raw.decode())


def test_a_catalog_gives_the_rules_the_yaml_gives(tmp_path, monkeypatch) -> None:
    """The whole catalog as setup.py writes it, in a copy of the rules directory, against no catalog."""
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    catalog = {}
    for f in builtin_dir().iterdir():
        if f.name.endswith(".yaml"):
            raw = f.read_bytes()
            (rules_dir / f.name).write_bytes(raw)
            catalog[f.name] = {"crc32": zlib.crc32(raw), "spec": yaml.safe_load(raw.decode())}
    monkeypatch.setattr(rules_module, "builtin_dir", lambda: rules_dir)
    from_yaml = [(r.id, r.spec) for r in load_rules()]
    (rules_dir / CATALOG).write_text(json.dumps(catalog))
    assert rules_module._catalog() == catalog

    def no_parse(text: str) -> None:
        raise AssertionError("a rule was parsed although the catalog holds it")

    with monkeypatch.context() as m:
        m.setattr(safe_yaml, "load_trusted_yaml", no_parse)
        assert [(r.id, r.spec) for r in load_rules()] == from_yaml
    (rules_dir / CATALOG).write_text("{not json")  # a damaged catalog: every rule from its YAML
    assert [(r.id, r.spec) for r in load_rules()] == from_yaml
