"""Turn ``.nsys-rep`` reports into SQLite exports with the ``nsys`` on PATH, cached outside the input.

perfdoctor never writes beside its inputs (a run directory may be read-only, shared, or someone
else's), so the export goes to ``$XDG_CACHE_HOME/perfdoctor/exports`` (``~/.cache/...`` by default),
named by the report's resolved path, size and modification time: analysing the same unchanged report
again reuses the export, a re-captured one is exported afresh. The export is written under a
temporary name and renamed when complete, so an interrupted export is never reused.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from perfdoctor.errors import InputError

REPORT_SUFFIX = ".nsys-rep"
EXPORT_TIMEOUT_S = 3600  # bounded time: a report of a large run exports in minutes


def cache_dir() -> Path:
    """Where exports of reports are kept (``$XDG_CACHE_HOME/perfdoctor/exports``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "perfdoctor" / "exports"


def cached_export_path(report: Path) -> Path:
    """The cache file for this report as it is now (path, size and mtime in the key)."""
    import hashlib  # only for an .nsys-rep (its OpenSSL binding costs start-up)

    st = report.stat()
    key = hashlib.sha256(f"{report.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:20]
    return cache_dir() / f"{report.stem}-{key}.sqlite"


def source_report(path: Path) -> Path | None:
    """The report a cached export was made from (None for any other file): a run directory's manifest
    lies beside the report, not beside its export."""
    side = path.with_suffix(".source")
    if path.parent != cache_dir() or not side.is_file():
        return None
    return Path(side.read_text(encoding="utf-8"))


def export_report(report: Path) -> Path:
    """The SQLite export of ``report``: from the cache when the report is unchanged, else made by
    ``nsys export``. Raises :class:`InputError` (one line) without nsys or when the export fails."""
    target = cached_export_path(report)
    if target.is_file():
        return target
    nsys = shutil.which("nsys")
    by_hand = (f"`nsys export --type sqlite -o {report.with_suffix('.sqlite').name} {report.name}`, "
               "then analyse the .sqlite")
    if nsys is None:
        raise InputError(f"{report}: an Nsight Systems report and no `nsys` on PATH to export it; export it by hand "
                         f"with {by_hand}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{report}: cannot create the export cache {target.parent} ({exc.strerror}); "
                         f"set XDG_CACHE_HOME or export by hand with {by_hand}") from None
    partial = target.with_name(f"{target.stem}.partial-{os.getpid()}.sqlite")
    argv = [nsys, "export", "--type=sqlite", "--force-overwrite=true", f"--output={partial}", str(report)]
    import subprocess  # only to export a report: an analysis of .sqlite exports never starts a process

    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                              timeout=EXPORT_TIMEOUT_S)
        ok = proc.returncode == 0 and partial.is_file() and partial.stat().st_size > 0
        if not ok:
            last = next((ln.strip() for ln in reversed((proc.stderr + proc.stdout).splitlines()) if ln.strip()), "")
            raise InputError(f"{report}: `nsys export` failed (exit {proc.returncode}): {last[:200]}")
        os.replace(partial, target)
        target.with_suffix(".source").write_text(str(report.resolve()), encoding="utf-8")
    except subprocess.TimeoutExpired:
        raise InputError(f"{report}: `nsys export` ran past {EXPORT_TIMEOUT_S} s; export it by hand with "
                         f"{by_hand}") from None
    finally:
        partial.unlink(missing_ok=True)
    return target
