"""The versioned JSON report (DESIGN §5; JSON Schema in perfdoctor/schema/report.schema.json).

The report lists every rank (devices, metrics, series, path), so at a thousand ranks its text is tens of
megabytes, and ``json.dumps`` with an indent holds it as a million small chunks before joining them: more
than the analysis itself held. :func:`write_json` writes it piece by piece instead (each device's dict made,
written and dropped in turn), byte for byte what ``json.dumps(report_dict(report), indent=2, default=str)``
gives.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict
from typing import Any

from perfdoctor.model import Report
from perfdoctor.quantiles import median
from perfdoctor.tuning_env import tuning_env

SCHEMA_VERSION = "1"
INDENT = 2
# Containers this many levels below the report are written item by item; deeper values (one rank's
# metrics, one device's dict) are encoded whole, each a few kilobytes.
STREAM_DEPTH = 3


def report_dict(report: Report) -> dict[str, Any]:
    """The report as one dict (what ``perfdoctor diff`` and the Perfetto writer read)."""
    return {key: list(value) if isinstance(value, Iterator) else dict(value) if key == "path" else value
            for key, value in _report_items(report)}


def _report_items(report: Report) -> Iterator[tuple[str, Any]]:
    """The report's top-level keys and values, in order; ``devices`` as an iterator (one dict at a time)."""
    run = report.run
    gpu_names = sorted({d.gpu_name for d in report.devices if d.gpu_name})
    step_counts = [len(d.step_ns) for d in report.devices if d.window]
    all_m = report.metrics["all"]
    env: dict[str, str] = {}
    for info in run.traces:
        env.update(tuning_env(info.env))
    yield "schema_version", SCHEMA_VERSION
    yield "tool_version", report.tool_version
    yield "inputs", [{
        "path": str(info.path),
        "format": info.format,
        "nsys_version": info.nsys_version,
        "product_version": info.product_version,
        "schema_version": info.schema_version,
        "has_cuda": info.has_cuda,
        "hostname": info.hostname,
        "session_start_utc_ns": info.session_start_utc_ns,
        "counts": info.counts,
    } for info in run.traces]
    yield "run", {
        "ranks": [tl.rank for tl in run.timelines],
        "devices": sum(1 for tl in run.timelines if tl.device_id is not None),
        "gpu": gpu_names[0] if len(gpu_names) == 1 else (gpu_names or None),
        "config": run.config,
        "config_sources": run.config_sources,
        "framework": run.framework,
        "env": env,
        "timelines": [{"rank": tl.rank, "rank_source": tl.rank_source, "pid": tl.pid,
                       "device_id": tl.device_id, "file": str(tl.trace.path)} for tl in run.timelines],
    }
    yield "steps", {
        "count": max(step_counts) if step_counts else 0,
        "source": report.devices[0].step_source if report.devices else None,
        "median_ms": all_m.get("step.time_ms"),
        "p90_ms": all_m.get("step.time_p90_ms"),
        "label": report.devices[0].step_label if report.devices else "",
        "excluded_ms": excluded_ms(report),
        "excluded_ranges": list(dict.fromkeys(r for d in report.devices for r in d.excluded_ranges)),
    }
    yield "metrics", report.metrics
    yield "devices", (asdict(d) for d in report.devices)
    yield "findings", report.findings
    yield "warnings", report.warnings
    yield "series", report.series
    yield "path", report.path


def excluded_ms(report: Report) -> float:
    """Median over devices of the device time before the first step (init, warm-up), ms."""
    values = [d.excluded_ns for d in report.devices if d.window]
    return round(float(median(values)) / 1e6, 3) if values else 0.0


def render_json(report: Report) -> str:
    buffer = io.StringIO()
    write_json(report, buffer.write)
    return buffer.getvalue()


def write_json(report: Report, write: Callable[[str], Any]) -> None:
    """Write the report's JSON text (and a final newline) through ``write``, piece by piece."""
    _write_dict(_report_items(report), 0, write)
    write("\n")


def _write_value(value: Any, level: int, write: Callable[[str], Any]) -> None:
    """``value`` as ``json.dumps(value, indent=INDENT, default=str)`` writes it ``level`` levels deep:
    item by item above STREAM_DEPTH (where every key is a string), whole below it."""
    if level < STREAM_DEPTH and isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        _write_dict(value.items(), level, write)
    elif level < STREAM_DEPTH and isinstance(value, (list, tuple, Iterator)):
        _write_list(value, level, write)
    else:  # JSON strings hold no raw newline, so re-indenting the text is exact
        text = json.dumps(value, indent=INDENT, default=str)
        write(text.replace("\n", "\n" + " " * (INDENT * level)) if level else text)


def _write_dict(items: Iterable[tuple[str, Any]], level: int, write: Callable[[str], Any]) -> None:
    inner = "\n" + " " * (INDENT * (level + 1))
    first = True
    for key, value in items:
        write(("{" if first else ",") + inner + json.dumps(key) + ": ")
        _write_value(value, level + 1, write)
        first = False
    write("{}" if first else "\n" + " " * (INDENT * level) + "}")


def _write_list(items: Iterable[Any], level: int, write: Callable[[str], Any]) -> None:
    inner = "\n" + " " * (INDENT * (level + 1))
    first = True
    for value in items:
        write(("[" if first else ",") + inner)
        _write_value(value, level + 1, write)
        first = False
    write("[]" if first else "\n" + " " * (INDENT * level) + "]")
