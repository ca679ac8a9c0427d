"""Secret scrubbing: one redaction rule for text, command lines and every SQLite export capture writes."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

from perfdoctor.capture.scrub import redact_command, redact_text, scrub_sqlite, secret_values
from perfdoctor.tuning_env import REDACTED, is_secret, tuning_env
from tests.capture.test_capture_signals_phases import capture

ENV = {"MY_API_TOKEN": "tok-0123456789", "AWS_SECRET_ACCESS_KEY": "aws-9876543210", "NCCL_IB_PASSWD": "ib-pw-4242",
       "NCCL_ALGO": "Ring", "PATH": "/usr/bin"}
ARGV = ["torchrun", "train.py", "--api-key", "xyz-cli-key", "--password=pw-cli-77",
        "--url", "https://bob:url-pw-55@example.com/data", "--lr", "3e-4"]


def test_the_rule_covers_the_issue_names() -> None:
    for name in ("MY_API_TOKEN", "AWS_SECRET_ACCESS_KEY", "NCCL_IB_PASSWD", "DB_PASSWORD", "HF_AUTH",
                 "GOOGLE_APPLICATION_CREDENTIALS", "api-key"):
        assert is_secret(name), name
    for name in ("NCCL_ALGO", "CUDA_DEVICE_MAX_CONNECTIONS", "PATH", "lr"):
        assert not is_secret(name), name
    assert tuning_env(ENV) == {"NCCL_ALGO": "Ring", "NCCL_IB_PASSWD": REDACTED}


def test_text_shapes_that_carry_secrets() -> None:
    assert redact_text("MY_API_TOKEN=a value with spaces") == f"MY_API_TOKEN={REDACTED}"
    block = "PATH=/usr/bin\0MY_API_TOKEN=tok 1\0NCCL_ALGO=Ring"  # nsys 2022.4 StringIds environment block
    assert redact_text(block) == f"PATH=/usr/bin\0MY_API_TOKEN={REDACTED}\0NCCL_ALGO=Ring"
    assert redact_text('NCCL_IB_PASSWD="ib pw"') == f'NCCL_IB_PASSWD="{REDACTED}"'  # META_DATA_CAPTURE row
    line = "python train.py --api-key xyz --password=hunter2 --lr 1 --url https://bob:pw@h.example/x --auth"
    assert redact_text(line) == (f"python train.py --api-key {REDACTED} --password={REDACTED} --lr 1 "
                                 f"--url https://{REDACTED}@h.example/x --auth")
    assert redact_text("git clone https://ghp_token@github.com/o/r") == f"git clone https://{REDACTED}@github.com/o/r"
    harmless = "step n=3 comm op=all_reduce group=dp bytes=4096 size=8 NCCL_ALGO=Ring --lr 1e-4 https://h/x"
    assert redact_text(harmless) == harmless
    assert redact_text("uses tok-0123456789 inline", ["tok-0123456789", "1"]) == f"uses {REDACTED} inline"


def test_command_lines_and_the_values_they_hide() -> None:
    assert redact_command(ARGV) == ["torchrun", "train.py", "--api-key", REDACTED, f"--password={REDACTED}",
                                    "--url", f"https://{REDACTED}@example.com/data", "--lr", "3e-4"]
    assert redact_command(["--token", "--next", "x"]) == ["--token", "--next", "x"]
    found = secret_values(ENV, ARGV)
    assert {"tok-0123456789", "aws-9876543210", "ib-pw-4242", "xyz-cli-key", "pw-cli-77", "bob:url-pw-55"} <= found
    assert not found & {"Ring", "/usr/bin", "3e-4", "train.py"}


def make_export(path: Path) -> None:
    """The tables where exports keep the environment and command line (2022.4 and 2023.4+ shapes), a blob,
    and a deleted row: its bytes stay in a free page unless the file is rewritten."""
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);"
                     "CREATE TABLE META_DATA_CAPTURE (name TEXT, value TEXT);"
                     "CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INT, name TEXT, value TEXT);"
                     "CREATE TABLE NVTX_EVENTS (start INT, text TEXT, textId INT, binaryData BLOB);"
                     "CREATE TABLE scratch (junk TEXT);")
    block = "\0".join(f"{k}={v}" for k, v in ENV.items())
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, block), (2, " ".join(ARGV)), (3, "step n=1")])
    db.executemany("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)",
                   [("PROCESS_1:COMMAND", " ".join(ARGV)), ("PROCESS_1:WORKING_DIR", "/work")] +
                   [("PROCESS_1:ENVIRONMENT_VARIABLE", f'{k}="{v}"') for k, v in ENV.items()])
    db.executemany("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (?, ?, ?)",
                   [(1, "Hostname", "node7"), (1, "ApiToken", "plain-value-31")])
    db.execute("INSERT INTO NVTX_EVENTS VALUES (1, 'comm op=all_reduce group=dp bytes=8 size=2', NULL, ?)",
               (b"\x01\x02tok-0123456789\x03",))
    db.executemany("INSERT INTO scratch VALUES (?)", [("ib-pw-4242 " * 400,)] * 20)
    db.commit()
    db.execute("DELETE FROM scratch")
    db.commit()
    db.close()


def test_an_export_holds_no_secret_byte_afterwards(tmp_path: Path) -> None:
    raw, clean = tmp_path / "raw.sqlite", tmp_path / "clean.sqlite"
    make_export(raw)
    assert b"ib-pw-4242" in raw.read_bytes()  # the deleted rows are still in the file
    changed = scrub_sqlite(raw, clean, secret_values(ENV, ARGV))
    data = clean.read_bytes()
    for secret in ("tok-0123456789", "aws-9876543210", "ib-pw-4242", "xyz-cli-key", "pw-cli-77", "url-pw-55",
                   "plain-value-31"):
        assert secret.encode() not in data, secret
    assert changed >= 8 and not (tmp_path / ".clean.sqlite.partial").exists()
    db = sqlite3.connect(clean)
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    assert strings[1].split("\0") == [f"MY_API_TOKEN={REDACTED}", f"AWS_SECRET_ACCESS_KEY={REDACTED}",
                                      f"NCCL_IB_PASSWD={REDACTED}", "NCCL_ALGO=Ring", "PATH=/usr/bin"]
    assert strings[3] == "step n=1"
    env_rows = [v for n, v in db.execute("SELECT name, value FROM META_DATA_CAPTURE") if "ENVIRONMENT" in n]
    assert 'NCCL_ALGO="Ring"' in env_rows and f'MY_API_TOKEN="{REDACTED}"' in env_rows
    assert dict(db.execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV")) == {"Hostname": "node7",
                                                                                   "ApiToken": REDACTED}
    text, blob = db.execute("SELECT text, binaryData FROM NVTX_EVENTS").fetchone()
    assert text == "comm op=all_reduce group=dp bytes=8 size=2"
    assert blob == b"\x01\x02" + b"*" * len("tok-0123456789") + b"\x03"  # same length: binary layouts hold
    assert db.execute("PRAGMA freelist_count").fetchone() == (0,)


def test_a_clean_export_is_left_as_it_was(tmp_path: Path) -> None:
    raw, clean = tmp_path / "raw.sqlite", tmp_path / "clean.sqlite"
    db = sqlite3.connect(raw)
    db.executescript("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT); "
                     "INSERT INTO StringIds VALUES (1, 'ncclDevKernel_AllReduce_Sum_f32_RING_LL'), (2, NULL);")
    db.close()
    assert scrub_sqlite(raw, clean) == 0
    assert sqlite3.connect(clean).execute("SELECT value FROM StringIds ORDER BY id").fetchall() == [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL",), (None,)]


FAKE_RUN_ENV = {"MY_API_TOKEN": "tok-fake-0123456", "AWS_SECRET_ACCESS_KEY": "aws-fake-6543210",
           "NCCL_IB_PASSWD": "ib-fake-4242"}


def test_no_file_capture_writes_holds_a_secret(fake_nsys: Path, tmp_path: Path) -> None:
    """The fake report holds the environment and command line as a real one does; everything but the
    report is scrubbed, and with --keep-reports no the report goes too."""
    run = tmp_path / "run"
    argv = [sys.executable, "-c", "import sys; print(sys.argv)", "--api-key", "xyz-fake-key",
            "--password=pw-fake-77", "https://bob:url-fake-55@example.com/x"]
    proc = capture(fake_nsys, run, *argv, options=("--keep-reports", "no"), env=FAKE_RUN_ENV)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    values = [*FAKE_RUN_ENV.values(), "xyz-fake-key", "pw-fake-77", "url-fake-55"]
    files = [p for p in run.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix == ".nsys-rep"]
    assert {p.suffix for p in files} >= {".sqlite", ".json"}
    for path in files:
        data = path.read_bytes()
        assert not [v for v in values if v.encode() in data], path
    assert not [v for v in values if v in err]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["env"]["NCCL_IB_PASSWD"] == "<redacted>" and manifest["capture"]["keep_reports"] is False


def test_kept_reports_are_announced_as_unscrubbed(fake_nsys: Path, tmp_path: Path) -> None:
    proc = capture(fake_nsys, tmp_path / "run", "true", options=("--keep-reports", "yes"))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "unredacted" in err and "--keep-reports yes" in err
