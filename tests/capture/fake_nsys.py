"""A stand-in for the nsys CLI, for launcher tests that must not depend on real nsys's timing.

Does what the launcher relies on and nothing more: ``--version``; ``profile --help`` (options and
``--trace`` values); ``profile [OPTIONS] PROGRAM...`` runs the program, outlives SIGINT/SIGTERM until the program ends
(the launcher signals every process of the run itself), writes ``<output>.nsys-rep`` and exits with
the program's exit code;
``export --output=X REPORT`` writes X. ``%h`` and ``%q{VAR}`` in ``--output`` are substituted.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

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
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    child = subprocess.Popen(args[i:], preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL)
                                                          for s in (signal.SIGINT, signal.SIGTERM)])
    rc = child.wait()
    with open(f"{output}.nsys-rep", "w") as fh:
        fh.write("fake report\n")
    return rc if rc >= 0 else 128 - rc


def main(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print("NVIDIA Nsight Systems version 2099.1.1.1-fake")
        return 0
    if argv[:2] == ["profile", "--help"]:
        print(HELP)
        return 0
    if argv[:1] == ["profile"]:
        return profile(argv[1:])
    if argv[:1] == ["export"]:
        out = next(a.split("=", 1)[1] for a in argv if a.startswith("--output="))
        with open(out, "w") as fh:
            fh.write("fake export\n")
        return 0
    print(f"fake nsys: unknown command {argv}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
