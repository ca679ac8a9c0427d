"""The versioned JSON report (DESIGN §5; JSON Schema in perfdoctor/schema/report.schema.json)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import numpy as np

from perfdoctor.model import Report
from perfdoctor.tuning_env import tuning_env

SCHEMA_VERSION = "1"


def report_dict(report: Report) -> dict[str, Any]:
    run = report.run
    gpu_names = sorted({d.gpu_name for d in report.devices if d.gpu_name})
    step_counts = [len(d.step_ns) for d in report.devices if d.window]
    all_m = report.metrics["all"]
    env: dict[str, str] = {}
    for info in run.traces:
        env.update(tuning_env(info.env))
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": report.tool_version,
        "inputs": [{
            "path": str(info.path),
            "format": info.format,
            "nsys_version": info.nsys_version,
            "product_version": info.product_version,
            "schema_version": info.schema_version,
            "has_cuda": info.has_cuda,
            "hostname": info.hostname,
            "session_start_utc_ns": info.session_start_utc_ns,
            "counts": info.counts,
        } for info in run.traces],
        "run": {
            "ranks": [tl.rank for tl in run.timelines],
            "devices": sum(1 for tl in run.timelines if tl.device_id is not None),
            "gpu": gpu_names[0] if len(gpu_names) == 1 else (gpu_names or None),
            "config": run.config,
            "config_sources": run.config_sources,
            "framework": run.framework,
            "env": env,
            "timelines": [{"rank": tl.rank, "rank_source": tl.rank_source, "pid": tl.pid,
                           "device_id": tl.device_id, "file": str(tl.trace.path)} for tl in run.timelines],
        },
        "steps": {
            "count": max(step_counts) if step_counts else 0,
            "source": report.devices[0].step_source if report.devices else None,
            "median_ms": all_m.get("step.time_ms"),
            "p90_ms": all_m.get("step.time_p90_ms"),
            "label": report.devices[0].step_label if report.devices else "",
            "excluded_ms": excluded_ms(report),
            "excluded_ranges": list(dict.fromkeys(r for d in report.devices for r in d.excluded_ranges)),
        },
        "metrics": report.metrics,
        "devices": [asdict(d) for d in report.devices],
        "findings": report.findings,
        "warnings": report.warnings,
        "series": report.series,
        "path": report.path,
    }


def excluded_ms(report: Report) -> float:
    """Median over devices of the device time before the first step (init, warm-up), ms."""
    values = [d.excluded_ns for d in report.devices if d.window]
    return round(float(np.median(values)) / 1e6, 3) if values else 0.0


def render_json(report: Report) -> str:
    return json.dumps(report_dict(report), indent=2, sort_keys=False, default=str) + "\n"
