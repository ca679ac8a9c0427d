"""Threat 1, data loss: an output path that is an input (directly, through a symlink, a hard link, a
file inside a run directory or a rules directory) is refused with exit 2 and the input is untouched;
outputs are written atomically (no half file, no temporary file left behind)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor.errors import UsageError
from perfdoctor.outputs import write_text
from tests.paths import REPO, SAMPLES
from tests.robustness.harness import assert_bad_input, digest, perfdoctor

TRACE = SAMPLES / "exposed_tp" / "exposed_tp.rank0.sqlite"


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    run = tmp_path / "run"
    (run / "memory").mkdir(parents=True)
    shutil.copy(TRACE, run / "rank0.sqlite")
    (run / "memory" / "rank0.pickle").write_bytes(b"\x80\x04N.")
    x = tmp_path / "x.sqlite"
    shutil.copy(TRACE, x)
    (tmp_path / "link.txt").symlink_to(x)
    os.link(x, tmp_path / "hard.txt")
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(REPO / "rules" / "gc-pause.yaml", rules / "my-gc.yaml")
    (rules / "my-gc.yaml").write_text((rules / "my-gc.yaml").read_text().replace("id: gc-pause", "id: my-gc"))
    return {"x": x, "run": run, "rules": rules, "tmp": tmp_path}


CASES = {
    "analyze -o the trace": ("analyze", "{x}", "-o", "{x}"),
    "analyze --html the trace": ("analyze", "{x}", "--html", "{x}"),
    "analyze --markdown the trace": ("analyze", "{x}", "--markdown", "{x}"),
    "analyze -o a symlink to the trace": ("analyze", "{x}", "-o", "{tmp}/link.txt"),
    "analyze --html a hard link to the trace": ("analyze", "{x}", "--html", "{tmp}/hard.txt"),
    "analyze -o a trace found in the run directory": ("analyze", "{run}", "-o", "{run}/rank0.sqlite"),
    "analyze -o a snapshot found in the run directory": ("analyze", "{run}", "-o", "{run}/memory/rank0.pickle"),
    "analyze --markdown a --rules file": ("analyze", "{x}", "--rules", "{rules}", "--markdown", "{rules}/my-gc.yaml"),
    "analyze -o the trace by another spelling": ("analyze", "{x}", "-o", "{tmp}/../{tmpname}/x.sqlite"),
    "memory -o the snapshot": ("memory", "{run}/memory/rank0.pickle", "-o", "{run}/memory/rank0.pickle"),
    "diff A B -o A": ("diff", "{x}", "{run}", "-o", "{x}"),
    "diff A B --markdown B's trace": ("diff", "{x}", "{run}", "--markdown", "{run}/rank0.sqlite"),
}


@pytest.mark.parametrize("args", list(CASES.values()), ids=list(CASES))
def test_output_onto_an_input_is_refused(inputs, args):
    tmp = inputs["tmp"]
    every_file = [p for p in tmp.rglob("*") if p.is_file() and not p.is_symlink()]
    before = {p: digest(p) for p in every_file}
    fields = {k: str(v) for k, v in inputs.items()} | {"tmpname": tmp.name}
    result = perfdoctor(*(a.format(**fields) for a in args))
    assert_bad_input(result, "is an input of this command")
    assert {p: digest(p) for p in every_file} == before
    assert not [p for p in tmp.rglob("*") if p.name.endswith(".tmp")]


def test_two_outputs_onto_one_file_are_refused(inputs, tmp_path):
    result = perfdoctor("analyze", inputs["x"], "-o", tmp_path / "r.txt", "--markdown", tmp_path / "r.txt")
    assert_bad_input(result, "the same file as --output")


def test_output_beside_the_input_is_written(inputs, tmp_path):
    result = perfdoctor("analyze", inputs["x"], "-o", tmp_path / "report.txt", "--markdown", tmp_path / "r.md")
    assert result.code == 0, result.err
    assert (tmp_path / "report.txt").read_text().startswith("trace ")
    assert (tmp_path / "r.md").read_text().startswith("## perfdoctor")


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "report.md"
    out.write_text("old report\n")
    out.chmod(0o640)
    with pytest.raises(UnicodeEncodeError):
        write_text(out, "half a report \ud800 never finished")  # fails inside the write
    assert out.read_text() == "old report\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]
    write_text(out, "new report\n")
    assert out.read_text() == "new report\n" and (out.stat().st_mode & 0o777) == 0o640


def test_write_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "real.md"
    target.write_text("old")
    (tmp_path / "link.md").symlink_to(target)
    write_text(tmp_path / "link.md", "new")
    assert (tmp_path / "link.md").is_symlink() and target.read_text() == "new"


def test_unwritable_output_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="cannot write"):
        write_text(tmp_path / "no-such-dir" / "r.md", "x")
    with pytest.raises(UsageError, match="is a directory"):
        write_text(tmp_path, "x")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_full_disk_is_exit_2(inputs):
    assert_bad_input(perfdoctor("analyze", inputs["x"], "-o", "/dev/full"), "No space left")
    with open("/dev/full", "w") as full:
        assert_bad_input(perfdoctor("analyze", inputs["x"], "-f", "json", stdout=full), "cannot write to stdout")


def test_closed_stdout_is_exit_2(inputs):
    proc = subprocess.run(["bash", "-c", f'exec "{sys.executable}" -m perfdoctor analyze "{inputs["x"]}" >&-'],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == ["perfdoctor: stdout is closed: give --output FILE"]
