"""``RUN_DIR/manifest.json``: what ran, where, with which software and settings, and what it produced.

Built from three sources: the launcher (command, times, exit code, nsys, environment), the per-rank
records the hook leaves in ``ranks/rank<R>.json`` (host, GPU, versions, parallel config, memory
recorder status), and the files in the run directory. The environment is reduced to the variables
that matter for tuning, with secret-looking values redacted (:mod:`perfdoctor.tuning_env`); so is
any secret-looking ``--option value`` of the command line.
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
from perfdoctor.tuning_env import REDACTED, is_secret, tuning_env

MANIFEST = "manifest.json"
MANIFEST_VERSION = "1"
LAUNCHER_PACKAGES = ("torch", "transformer_engine", "megatron_core", "megatron_bridge", "nemo_toolkit", "nvtx")


def redact_command(argv: Sequence[str]) -> list[str]:
    """``--api-key=abc`` / ``--api-key abc`` / ``WANDB_API_KEY=abc`` → value replaced by ``<redacted>``."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if eq and is_secret(name.lstrip("-")):
            out.append(f"{name}={REDACTED}")
        elif arg.startswith("-") and not eq and is_secret(arg.lstrip("-")):
            out.append(arg)
            hide_next = True
        else:
            out.append(arg)
    return out


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
                   ended: float, exit_code: int | None, interrupted: str | None, nsys: Mapping[str, Any],
                   options: Mapping[str, Any], env: Mapping[str, str], files: Sequence[Path],
                   gpus: Sequence[str], notes: Sequence[str]) -> dict[str, Any]:
    ranks = rank_records(run_dir)
    memory = {str(r.get("rank")): r.get("memory", {}) for r in ranks}
    config = next((r["config"] for r in ranks if r.get("config")), {})
    versions: dict[str, str] = {"perfdoctor": __version__, "nsys": str(nsys.get("version"))}
    versions.update(_launcher_versions())
    for record in ranks:  # what the ranks imported wins over what the launcher's Python has
        versions.update(record.get("versions") or {})
    hosts = sorted({socket.gethostname(), *(r["host"] for r in ranks if r.get("host"))})
    return {
        "manifest_version": MANIFEST_VERSION,
        "command": redact_command(command),
        "launched": redact_command(wrapped),
        "start_time": _iso(started),
        "end_time": _iso(ended),
        "duration_s": round(ended - started, 3),
        "exit_code": exit_code,
        "interrupted_by": interrupted,
        "hosts": hosts,
        "platform": {"system": platform.system(), "release": platform.release(), "python": platform.python_version()},
        "ranks": [{k: r.get(k) for k in ("rank", "local_rank", "world_size", "host", "pid", "gpu", "steps_done",
                                         "profiler", "nvtx_backend")} for r in ranks],
        "world_size": max((r.get("world_size") or 0 for r in ranks), default=None),
        "gpus": sorted(set(gpus) | {r["gpu"] for r in ranks if r.get("gpu")}),
        "config": config,
        "capture": dict(options),
        "nsys": dict(nsys),
        "versions": versions,
        "memory": memory,
        "files": sorted(str(p.relative_to(run_dir)) for p in files),
        "env": tuning_env(dict(env)),
        "notes": list(notes),
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
