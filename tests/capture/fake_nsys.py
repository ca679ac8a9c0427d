"""A stand-in for the nsys CLI, for launcher tests that must not depend on real nsys's timing.

Does what the launcher relies on and nothing more: ``--version``; ``profile --help`` (options and
``--trace`` values); ``profile [OPTIONS] PROGRAM...`` runs the program, outlives one SIGINT/SIGTERM
until the program ends (a second signal or SIGHUP ends it without a report, as they end nsys 2022.4),
writes ``<output>.nsys-rep`` and exits with the program's exit code; ``export --output=X REPORT``
writes X as SQLite holding what real exports hold about the run: the environment block (2022.4
``StringIds``, NUL-separated), and the environment and command line as 2023.4+ ``META_DATA_CAPTURE``
rows. ``%h`` and ``%q{VAR}`` in ``--output`` are substituted. It names itself ``nsys`` (the process
name the launcher knows nsys by).

Timing knobs for the phase tests (environment of the capture): ``FAKE_NSYS_VERSION_S`` (seconds
``--version`` takes: perfdoctor is then still checking, before launch), ``FAKE_NSYS_EXPORT_S`` (seconds
an export takes). Each writes its pid to ``FAKE_NSYS_PID_FILE`` before it waits.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time

HELP = """usage: nsys profile [<args>] [application] [<application args>]
\t--cpuctxsw=
\t-s, --sample=
\t-o, --output=
\t-f, --force-overwrite=
\t-c, --capture-range=
\t--capture-range-end=
\t-t, --trace=

\t   Possible values are 'cuda', 'nvtx', 'osrt', 'cublas' or 'none'.
\t   Select the API(s) to trace.
"""


def substitute(pattern: str) -> str:
    pattern = pattern.replace("%h", socket.gethostname())
    return re.sub(r"%q\{(\w+)\}", lambda m: os.environ.get(m.group(1), m.group(0)), pattern)


def profile(args: list[str]) -> int:
    output = None
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i].startswith("--output="):
            output = substitute(args[i].split("=", 1)[1])
        i += 1
    received: list[int] = []

    def like_nsys(signum: int, _frame: object) -> None:
        """nsys 2022.4, as measured: a first SIGINT/SIGTERM waits for the program and writes the report;
        a second one quits without it (SIGHUP, left at its default, kills at once)."""
        received.append(signum)
        if len(received) > 1:
            os._exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, like_nsys)
    child = subprocess.Popen(args[i:], preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL)
                                                          for s in (signal.SIGINT, signal.SIGTERM)])
    rc = child.wait()
    if not os.environ.get("FAKE_NSYS_NO_REPORT"):
        with open(f"{output}.nsys-rep", "w") as fh:
            json.dump({"env": dict(os.environ), "command": args[i:]}, fh)
    return rc if rc >= 0 else 128 - rc


def export(argv: list[str]) -> int:
    out = next(a.split("=", 1)[1] for a in argv if a.startswith("--output="))
    with open(argv[-1]) as fh:
        report = json.load(fh)
    wait("FAKE_NSYS_EXPORT_S")
    db = sqlite3.connect(out)
    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("CREATE TABLE META_DATA_CAPTURE (name TEXT, value TEXT)")
    block = "\0".join(f"{k}={v}" for k, v in report["env"].items())
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, block), (2, "step n=1")])
    db.execute("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_1:COMMAND', ?)", (" ".join(report["command"]),))
    db.executemany("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_1:ENVIRONMENT_VARIABLE', ?)",
                   [(f'{k}="{v}"',) for k, v in report["env"].items()])
    db.commit()
    db.close()
    return 0


def wait(knob: str) -> None:
    seconds = float(os.environ.get(knob, "0"))
    if seconds and os.environ.get("FAKE_NSYS_PID_FILE"):
        with open(os.environ["FAKE_NSYS_PID_FILE"] + ".partial", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(os.environ["FAKE_NSYS_PID_FILE"] + ".partial", os.environ["FAKE_NSYS_PID_FILE"])
    time.sleep(seconds)


def main(argv: list[str]) -> int:
    ctypes.CDLL(None).prctl(15, b"nsys", 0, 0, 0)  # PR_SET_NAME: /proc/<pid>/comm as real nsys's
    if argv[:1] == ["--version"]:
        wait("FAKE_NSYS_VERSION_S")
        print("NVIDIA Nsight Systems version 2099.1.1.1-fake")
        return 0
    if argv[:2] == ["profile", "--help"]:
        print(HELP)
        return 0
    if argv[:1] == ["profile"]:
        return profile(argv[1:])
    if argv[:2] == ["export", "--help"]:
        print("\t--type=\n\t--output=\n\t--force-overwrite=\n")
        return 0
    if argv[:1] == ["export"]:
        return export(argv)
    print(f"fake nsys: unknown command {argv}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
