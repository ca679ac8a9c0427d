"""The shipped rule catalog is validated against rule.schema.json here, at test time, so that
``perfdoctor analyze`` can skip the jsonschema walk on every run (it only checks the top-level keys)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import perfdoctor
from perfdoctor.diagnose.rules import RuleError, builtin_dir, load_rule, load_rules

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is needed to validate rule files")

SCHEMA = json.loads((Path(perfdoctor.__file__).parent / "schema" / "rule.schema.json").read_text())


def test_every_shipped_rule_matches_the_schema():
    files = sorted(builtin_dir().glob("*.yaml"))
    assert len(files) >= 10
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for path in files:
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert not errors, f"{path.name}: {errors[:3]}"


def test_shipped_rule_missing_a_required_key_is_still_refused(tmp_path):
    """A shipped rule skips the schema walk, not the check: a damaged file is one line, not a traceback."""
    good = yaml.safe_load((builtin_dir() / "gc-pause.yaml").read_text())
    del good["impact"]
    path = tmp_path / "gc-pause.yaml"
    path.write_text(yaml.safe_dump(good))
    with pytest.raises(RuleError, match=r"gc-pause.yaml: <top>: 'impact' is a required property"):
        load_rule(path, schema_checked=True)


def test_analyze_does_not_import_jsonschema_without_user_rules():
    code = ("import sys; from perfdoctor.diagnose.rules import load_rules; load_rules(); "
            "print('jsonschema' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
    assert load_rules()  # and the catalog still loads in this process
