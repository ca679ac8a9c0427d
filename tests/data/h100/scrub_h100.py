"""Scrub the captures of capture_h100.py before they are committed (README.md beside this file).

Kineto JSON: the profiler's temporary file name (``traceName``) becomes the file's own name and the
random ``trace_id`` zeros; the text is edited in place so that PyTorch's layout (one
indented block per event), which perfdoctor's streaming reader relies on, stays as written.
Memory snapshot: stack-frame file names lose the machine's prefixes (``/opt/.../site-packages/torch/x.py``
→ ``site-packages/torch/x.py``, the capture script → its name). Then every output is checked for the
machine's host and user names and for absolute paths.

Usage: python scrub_h100.py RAW_DIR OUT_DIR HOSTNAME USER
"""

from __future__ import annotations

import gzip
import io
import pickle
import re
import sys
from pathlib import Path

ABSOLUTE = re.compile(r"(?<![\w.])/(?:opt|work|root|home|tmp|usr|var)/[^\s\"']*")
SITE = re.compile(r"^.*/(site-packages/.*)$")
TRACE_NAME = re.compile(rb'"traceName": "[^"]*"')
TRACE_ID = re.compile(rb'"trace_id": "[0-9A-Fa-f]*"')  # random, but token-shaped: zeroed


class PlainData(pickle.Unpickler):
    """A snapshot is plain data: refuse any global."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"global {module}.{name} in a memory snapshot")


def short_path(path: str) -> str:
    site = SITE.match(path)
    return site.group(1) if site else Path(path).name if path.startswith("/") else path


def scrub_kineto(raw: Path, out: Path) -> None:
    text = gzip.decompress(raw.read_bytes())
    text = TRACE_NAME.sub(f'"traceName": "{out.name.removesuffix(".gz")}"'.encode(), text)
    text = TRACE_ID.sub(b'"trace_id": "' + b"0" * 32 + b'"', text)
    out.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))


def scrub_snapshot(raw: Path, out: Path) -> None:
    data = PlainData(io.BytesIO(gzip.decompress(raw.read_bytes()) if raw.suffix == ".gz" else raw.read_bytes())).load()

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "filename" and isinstance(value, str):
                    node[key] = short_path(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(data)
    out.write_bytes(pickle.dumps(data))


def check(path: Path, forbidden: list[str]) -> None:
    data = path.read_bytes()
    text = (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode("latin-1")
    for word in forbidden:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", text):
            raise SystemExit(f"{path}: still holds {word!r}")
    if hit := ABSOLUTE.search(text):
        raise SystemExit(f"{path}: still holds the absolute path {hit.group(0)!r}")


def main() -> None:
    raw, out, host, user = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    out.mkdir(parents=True, exist_ok=True)
    traces = [p.name for p in sorted(raw.glob("gpt_*.json.gz"))]  # eager, cudagraph; compiled from its own run
    for name in traces:
        scrub_kineto(raw / name, out / name)
    scrub_snapshot(raw / "gpt_memory.pickle.gz", out / "gpt_memory.pickle")
    for name in [*traces, "gpt_memory.pickle"]:
        check(out / name, [host, user])
        print(f"{name}\t{(out / name).stat().st_size} bytes, clean")


if __name__ == "__main__":
    main()
