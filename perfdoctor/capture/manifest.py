"""``RUN_DIR/manifest.json``: what ran, where, with which software and settings, and what it produced.

Built from three sources: the launcher (command, times, exit code, nsys, environment), the per-rank
records the hook leaves in ``ranks/rank<R>.json`` (host, GPU, versions, parallel config, memory
recorder status), and the files in the run directory. The environment is reduced to the variables
that matter for tuning; secret-looking values there, in the command line and in the notes are
redacted (:mod:`perfdoctor.capture.scrub`).
"""

from __future__ import annotations

import json
import os
import platform
import socket
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from perfdoctor import __version__
from perfdoctor.capture.scrub import redact_command, redact_text
from perfdoctor.tuning_env import tuning_env

MANIFEST = "manifest.json"
MANIFEST_VERSION = "1"
LAUNCHER_PACKAGES = ("torch", "transformer_engine", "megatron_core", "megatron_bridge", "nemo_toolkit", "nvtx")


def rank_records(run_dir: Path) -> list[dict[str, Any]]:
    """The hook's per-rank records, by rank (unreadable ones are skipped: the manifest says how many)."""
    records = []
    for path in sorted((run_dir / "ranks").glob("rank*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return sorted(records, key=lambda r: r.get("rank", 0))


def build_manifest(*, run_dir: Path, command: Sequence[str], wrapped: Sequence[str], started: float,
                   ended: float, exit_code: int | None, capture_exit_code: int, interrupted: str | None,
                   interrupted_during: str | None, signals: int, nsys: Mapping[str, Any] | None,
                   options: Mapping[str, Any], env: Mapping[str, str], files: Sequence[Path],
                   gpus: Sequence[str], notes: Sequence[str], secrets: Sequence[str] | set[str] = (),
                   profiler: str = "nsys", not_exported: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    """``exit_code`` is the training command's (None: never started); ``capture_exit_code`` perfdoctor's;
    ``profiler`` what recorded the run (nsys, or torch: each rank's torch.profiler, ``nsys`` None);
    ``not_exported``: the reports left without an SQLite export, what that loses and how to export them.
    Every string that comes from the user (command, options, notes, environment) is redacted."""
    ranks = rank_records(run_dir)
    memory = {str(r.get("rank")): r.get("memory", {}) for r in ranks}
    config = next((r["config"] for r in ranks if r.get("config")), {})
    versions: dict[str, str] = {"perfdoctor": __version__}
    if nsys is not None:
        versions["nsys"] = str(nsys.get("version"))
    versions.update(_launcher_versions())
    for record in ranks:  # what the ranks imported wins over what the launcher's Python has
        versions.update(record.get("versions") or {})
    hosts = sorted({socket.gethostname(), *(r["host"] for r in ranks if r.get("host"))})
    return {
        "manifest_version": MANIFEST_VERSION,
        "profiler": profiler,
        "command": redact_command(command, secrets),
        "launched": redact_command(wrapped, secrets),
        "start_time": _iso(started),
        "end_time": _iso(ended),
        "duration_s": round(ended - started, 3),
        "exit_code": exit_code,
        "capture_exit_code": capture_exit_code,
        "interrupted": interrupted is not None,
        "interrupted_by": interrupted,
        "interrupted_during": interrupted_during,
        "signals_received": signals,
        "hosts": hosts,
        "platform": {"system": platform.system(), "release": platform.release(), "python": platform.python_version()},
        "ranks": [{k: r.get(k) for k in ("rank", "local_rank", "world_size", "host", "pid", "gpu", "steps_done",
                                         "profiler", "nvtx_backend")} for r in ranks],
        "world_size": max((r.get("world_size") or 0 for r in ranks), default=None),
        "gpus": sorted(set(gpus) | {r["gpu"] for r in ranks if r.get("gpu")}),
        "config": config,
        "capture": {k: (redact_command(v, secrets) if k == "nsys_args" else v) for k, v in options.items()},
        "nsys": dict(nsys) if nsys is not None else None,
        "versions": versions,
        "memory": memory,
        "files": sorted(str(p.relative_to(run_dir)) for p in files),
        "env": {k: redact_text(v, secrets) for k, v in tuning_env(dict(env)).items()},
        "not_exported": [{k: redact_text(v, secrets) for k, v in entry.items()} for entry in not_exported],
        "notes": [redact_text(n, secrets) for n in notes],
    }


def write_manifest(run_dir: Path, manifest: Mapping[str, Any]) -> Path:
    path = run_dir / MANIFEST
    partial = run_dir / f".{MANIFEST}.partial"
    partial.write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    os.replace(partial, path)
    return path


def _launcher_versions() -> dict[str, str]:
    found = {}
    for package in LAUNCHER_PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc).isoformat(timespec="milliseconds")
