"""Threat 4 (YAML and JSON part), bombs: hostile rule files, scenarios and saved reports cost bounded
time and memory and give exit 2 with one line naming the file; nothing blocks on a FIFO or reads
forever from a device. (Pickle bombs: tests/robustness/test_pickle_bombs.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from perfdoctor.errors import InputError
from perfdoctor.safe_yaml import MAX_BYTES, MAX_DEPTH, load_json_file, load_yaml_file
from tests.paths import REPO, SAMPLES
from tests.robustness.harness import assert_bad_input, perfdoctor

TIMEOUT_S = 60  # each of these answers in about a second; a hang or a bomb would not


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def write_hostile(d: Path, kind: str) -> Path:
    path = d / f"{kind}.yaml"
    if kind == "deep-flow":  # 100 kB; libyaml's composer recursion crashed the interpreter (SIGSEGV)
        path.write_text("id: deep-flow\nwhen: " + "[" * 50_000 + "]" * 50_000 + "\n")
    elif kind == "deep-block":
        path.write_text("- " * 20_000 + "1\n")  # block sequences nested on one line
    elif kind == "alias-bomb":  # 9^9 conditions once expanded, in an otherwise valid rule: validation walks them
        rule = (REPO / "rules" / "gc-pause.yaml").read_text().replace("id: gc-pause", "id: alias-bomb")
        bomb = ["x-bomb:", "  a0: &a0 {metric: step.time_ms, op: gt, value: 1}"]
        bomb += [f"  a{i}: &a{i} {{all: [{', '.join([f'*a{i - 1}'] * 9)}]}}" for i in range(1, 10)]
        path.write_text("\n".join(bomb) + "\n" + re.sub(r"^when:(.|\n)*?^(?=\w)", "when: *a9\n", rule, count=1,
                                                         flags=re.M))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "huge":
        path.write_text("id: huge\ntitle: " + "x" * (MAX_BYTES + 10) + "\n")
    elif kind == "not-utf8":
        path.write_bytes(b"id: not-utf8\ntitle: \xff\xfe\n")
    return path


KINDS = ["deep-flow", "deep-block", "alias-bomb", "fifo", "dev-zero", "huge", "not-utf8"]
# What the one line must say is wrong. Nesting is caught by perfdoctor's depth bound or, first, by libyaml's own
# (PyYAML >= 6.0.3's C loader stops a deep flow with "exceeded maximum nesting depth"): either names it.
NEEDLE = {"deep-flow": ("nested deeper", "nesting depth"), "deep-block": ("nested deeper", "nesting depth"),
          "alias-bomb": ("alias",), "fifo": ("not a regular file",), "dev-zero": ("not a regular file",),
          "huge": ("limit",), "not-utf8": ("cannot read",)}


@pytest.mark.parametrize(("command", "kind"), [("rules", k) for k in KINDS] +
                         [("analyze", k) for k in ("deep-flow", "alias-bomb", "fifo")])
def test_hostile_rule_file_is_one_line_exit_2(tmp_path, kind, command):
    path = write_hostile(tmp_path, kind)
    args = ["rules", "--rules", tmp_path] if command == "rules" else \
        ["analyze", SAMPLES / "exposed_tp" / "exposed_tp.rank0.sqlite", "--rules", tmp_path]
    result = perfdoctor(*args, timeout=TIMEOUT_S)
    assert_bad_input(result, str(path))
    reason = result.err.split(str(path), 1)[1]
    assert any(needle in reason for needle in NEEDLE[kind]), reason


@pytest.mark.parametrize("kind", ["deep-flow", "alias-bomb", "fifo", "dev-zero"])
def test_hostile_scenario_is_one_line_exit_2(tmp_path, kind):
    path = write_hostile(tmp_path, kind)
    assert_bad_input(perfdoctor("synth", path, "-o", tmp_path / "out", timeout=TIMEOUT_S), str(path))


def test_bounds_leave_honest_files_alone(tmp_path):
    nested = tmp_path / "nested.yaml"
    nested.write_text("a: " + "[" * (MAX_DEPTH - 2) + "1" + "]" * (MAX_DEPTH - 2) + "\nb: &x [1, 2]\nc: *x\n")
    data = load_yaml_file(nested)
    assert data["c"] == [1, 2]
    with pytest.raises(InputError, match="nested deeper"):
        (tmp_path / "deeper.yaml").write_text("a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
        load_yaml_file(tmp_path / "deeper.yaml")


def _report(tmp_path: Path, name: str, **change) -> Path:
    report = {"schema_version": "1", "metrics": {"all": {"step.time_ms": 100.0}, "ranks": {}},
              "series": {}, "findings": [], "steps": {"count": 5}, "run": {}}
    report.update(change)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(report))
    return path


BAD_REPORTS = {
    "metrics.all a list": {"metrics": {"all": [1, 2]}},
    "series a list": {"series": [1]},
    "series of numbers": {"series": {"0": 5}},
    "findings an object": {"findings": {"rule": "x"}},
    "finding rule a list": {"findings": [{"rule": ["x"]}]},
    "steps.count a string": {"steps": {"count": "five"}},
    "run a string": {"run": "x"},
}


@pytest.mark.parametrize("change", list(BAD_REPORTS.values()), ids=list(BAD_REPORTS))
def test_diff_report_of_the_wrong_shape_is_exit_2(tmp_path, change):
    good, bad = _report(tmp_path, "good"), _report(tmp_path, "bad", **change)
    assert_bad_input(perfdoctor("diff", good, bad, timeout=TIMEOUT_S), f"{bad}: not a perfdoctor report")


@pytest.mark.parametrize(("text", "fmt"), [("NaN", "--html"), ("Infinity", "--html"), ("-Infinity", "--markdown"),
                                           ("1e999", "--markdown")])
def test_diff_report_with_non_finite_numbers_is_exit_2(tmp_path, text, fmt):
    good = _report(tmp_path, "good")
    bad = tmp_path / "bad.json"
    bad.write_text(good.read_text().replace("100.0", text))
    assert_bad_input(perfdoctor("diff", good, bad, fmt, tmp_path / "d.out", timeout=TIMEOUT_S),
                     f"{bad}: not valid JSON")


def test_deeply_nested_json_report_is_exit_2(tmp_path):
    good = _report(tmp_path, "good")
    deep = tmp_path / "deep.json"
    deep.write_text('{"schema_version": "1", "metrics": ' + "[" * 200_000 + "]" * 200_000 + "}")
    assert_bad_input(perfdoctor("diff", good, deep, timeout=TIMEOUT_S), str(deep))


def test_json_reader_refuses_devices_and_oversize(tmp_path):
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    with pytest.raises(InputError, match="not a regular file"):
        load_json_file(tmp_path / "zero.json", 1 << 20)
    shutil.copy(_report(tmp_path, "r"), tmp_path / "big.json")
    with pytest.raises(InputError, match="limit"):
        load_json_file(tmp_path / "big.json", 10)
