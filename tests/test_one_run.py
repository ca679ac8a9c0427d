"""One run at a time: inputs that are different captures are refused (exit 2, the groups listed),
unless --allow-mixed; the ranks of one capture are never split."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from tests.paths import REAL_H100, SAMPLES, TRACES
from tests.test_cli_bad_input import assert_one_line_error, run_cli

PP = SAMPLES / "pp_1f1b"
MINUTES = 60 * 10**9


def copy_run(dst: Path) -> list[Path]:
    dst.mkdir(parents=True)
    return [Path(shutil.copy2(p, dst / p.name)) for p in sorted(PP.glob("*.sqlite"))]


def shift_session(path: Path, ns: int) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + ?", (ns,))
    conn.close()


def set_world(path: Path, world: int) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE StringIds SET value = substr(value, 1, instr(value, 'world=') + 5) || ? "
                     "WHERE value LIKE 'rank r=%'", (str(world),))
    conn.close()


def test_ranks_of_one_capture_are_one_run(capsys, tmp_path):
    copy_run(tmp_path / "run")
    code, out, err = run_cli(capsys, "analyze", str(tmp_path / "run"), "--format", "json")
    assert code == 0, err
    assert len(json.loads(out)["devices"]) == 4


def test_captures_80_minutes_apart_are_refused(capsys, tmp_path):
    files = copy_run(tmp_path / "run")
    for path in files[2:]:
        shift_session(path, 80 * MINUTES)
    code, _, err = run_cli(capsys, "analyze", str(tmp_path / "run"))
    assert_one_line_error(code, err, "2 different captures, not one run")
    first, second = err.split("[2]")
    assert "pp_1f1b.rank0.sqlite, pp_1f1b.rank2.sqlite" in first and "20:26:40" in first
    assert "pp_1f1b.rank4.sqlite, pp_1f1b.rank6.sqlite" in second and "21:46:40" in second
    assert "--allow-mixed" in err

    code, out, err = run_cli(capsys, "analyze", str(tmp_path / "run"), "--allow-mixed", "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert len(report["devices"]) == 4
    assert any("--allow-mixed: 2 different captures" in w for w in report["warnings"])


def test_different_world_sizes_are_refused(capsys, tmp_path):
    files = copy_run(tmp_path / "run")
    set_world(files[0], 16)
    code, _, err = run_cli(capsys, "analyze", str(tmp_path / "run"))
    assert_one_line_error(code, err, "2 different captures")
    assert "world size 16" in err and "world size 8" in err


def test_different_manifests_are_refused(capsys, tmp_path):
    files = copy_run(tmp_path / "runs" / "a")
    b = tmp_path / "runs" / "b"
    b.mkdir()
    for path in files[2:]:
        shutil.move(path, b / path.name)
    for name, command in (("a", "torchrun a.py"), ("b", "torchrun b.py")):
        (tmp_path / "runs" / name / "manifest.json").write_text(json.dumps(
            {"manifest_version": 1, "command": command, "hosts": ["node000"]}))
    code, _, err = run_cli(capsys, "analyze", str(tmp_path / "runs"))
    assert_one_line_error(code, err, "2 different captures")
    assert str(tmp_path / "runs" / "a" / "manifest.json") in err and str(tmp_path / "runs" / "b") in err
    code, _, err = run_cli(capsys, "analyze", str(tmp_path / "runs" / "a"))
    assert code == 0, err


def test_diff_refuses_a_mixed_side(capsys, tmp_path):
    files = copy_run(tmp_path / "run")
    shift_session(files[0], -90 * MINUTES)
    code, _, err = run_cli(capsys, "diff", str(PP), str(tmp_path / "run"))
    assert_one_line_error(code, err, "2 different captures")


REAL_MPI = TRACES / "nsys" / "pipit_saxpy_mpi.sqlite"


def test_two_real_captures_are_not_one_run(capsys):
    code, _, err = run_cli(capsys, "analyze", str(REAL_H100), str(REAL_MPI))
    assert_one_line_error(code, err, "2 different captures")
    assert "h100_2gpu_fastvideo.sqlite" in err and "pipit_saxpy_mpi.sqlite" in err
