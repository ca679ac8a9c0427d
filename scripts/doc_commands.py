"""The shell commands that README.md and docs/ show, read from their fenced ``bash`` blocks.

CI runs the README's first set-up command verbatim (``.ci/run`` calls ``setup N``), and
tests/test_docs_commands.py runs every other documented command, so neither can drift from the text.

    python scripts/doc_commands.py setup 1      # the first set-up command, as printed in README.md
    python scripts/doc_commands.py list FILE    # every command of FILE, one per line
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

FENCE = re.compile(r"^```(bash|sh|shell)\s*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SETUP = re.compile(r"^## Set-up\s*\n(.*?)(?=^## )", re.MULTILINE | re.DOTALL)


def commands(markdown: str) -> list[str]:
    """Each command of each fenced shell block: continuation lines joined, comments and blank lines dropped,
    a trailing ``# comment`` removed."""
    out: list[str] = []
    for _, body in FENCE.findall(markdown):
        pending = ""
        for line in body.splitlines():
            line = pending + line.strip()
            pending = ""
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def setup_commands(readme: str) -> list[str]:
    """The commands of the README's "Set-up" section, in order (exactly two: install+analyse, tests)."""
    section = SETUP.search(readme)
    if section is None:
        raise SystemExit("README.md has no '## Set-up' section")
    return commands(section.group(1))


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[1]
    if argv[:1] == ["setup"] and len(argv) == 2:
        found = setup_commands((root / "README.md").read_text(encoding="utf-8"))
        if len(found) != 2:
            print(f"README.md: the Set-up section must hold exactly two commands, found {len(found)}", file=sys.stderr)
            return 2
        print(found[int(argv[1]) - 1])
        return 0
    if argv[:1] == ["list"] and len(argv) == 2:
        print("\n".join(commands(Path(argv[1]).read_text(encoding="utf-8"))))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
