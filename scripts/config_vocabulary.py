"""Write tests/data/research/config_vocabulary.txt: every identifier in the project's research notes and
the tuning guides, one per line, sorted.

The knob-snippet tests check that every Megatron-Bridge / NeMo 2 config field a rule prints is a name those
texts use (the crosswalk of config fields). The texts live outside the repository, so the tests read this
word list instead; rerun this script, naming the folders, when the notes or the guides change:

    python scripts/config_vocabulary.py PATH/TO/research PATH/TO/guide
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "research" / "config_vocabulary.txt"
WORD = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


def vocabulary(folders: list[Path]) -> list[str]:
    """The identifiers of every Markdown file below the folders, sorted, each once."""
    words: set[str] = set()
    for folder in folders:
        for path in sorted(folder.glob("**/*.md")):
            words.update(WORD.findall(path.read_text(errors="replace")))
    return sorted(words)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders of Markdown notes and guides")
    words = vocabulary(parser.parse_args().folders)
    OUT.write_text("\n".join(words) + "\n")
    print(f"{OUT}: {len(words)} words")


if __name__ == "__main__":
    main()
