"""Output of ``perfdoctor memory``: memory measurements of CUDA snapshots as rich tables or JSON.

Only formatting: the numbers come from :func:`perfdoctor.measure.memory.measure_memory`. File names
and function names from the snapshot's stacks are user data: they reach rich as ``Text``, never as
markup.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from perfdoctor.measure.memory import MemoryMeasurement
from perfdoctor.render.summary import history_time

SCHEMA_VERSION = "1"
SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60


def memory_dict(measurements: list[MemoryMeasurement], tool_version: str) -> dict[str, Any]:
    """The JSON form: one entry per snapshot with the ``memory.*`` metrics and their evidence."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": tool_version,
        "snapshots": [{"file": m.evidence.get("file"), "rank": m.rank, "device": m.device, "metrics": m.metrics,
                       "evidence": m.evidence} for m in measurements],
        "warnings": [w for m in measurements for w in m.warnings],
    }


def render_memory_json(measurements: list[MemoryMeasurement], tool_version: str) -> str:
    return json.dumps(memory_dict(measurements, tool_version), indent=2) + "\n"


def render_memory_terminal(measurements: list[MemoryMeasurement], console: Console) -> None:
    for m in measurements:
        title = Text(" · ".join(bit for bit in (
            f"rank {m.rank}" if m.rank is not None else None,
            str(m.evidence.get("file") or ""),
            f"device {m.device}" if m.device is not None else "no device",
        ) if bit))
        console.print(Panel(Group(*memory_tables(m.metrics, m.evidence)), title=title, title_align="left"))
    warnings = [w for m in measurements for w in m.warnings]
    if warnings:
        console.print(Text("warnings", style="bold yellow"))
        for w in warnings:
            console.print(Text(f"  ! {w}", style="yellow"))


def memory_tables(metrics: dict[str, Any], evidence: dict[str, Any]) -> list:
    """Summary table, allocated-over-time sparkline and top allocation sites of one snapshot (also used
    for the memory part of a device block in ``perfdoctor analyze``)."""
    if evidence.get("device") is None:
        return [Text("the snapshot holds no segments and no history")]
    t = Table(title="memory (CUDA caching allocator)", title_justify="left", show_header=False, box=None,
              padding=(0, 2))
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_column(style="dim")
    if evidence.get("has_history", True):
        t.add_row("peak allocated", _bytes(metrics.get("memory.peak_allocated_bytes")),
                  _at(evidence.get("peak_allocated_at_us"), evidence))
        t.add_row("peak reserved", _bytes(metrics.get("memory.peak_reserved_bytes")),
                  _at(evidence.get("peak_reserved_at_us"), evidence))
        t.add_row("fragmentation", _pct(metrics.get("memory.fragmentation_fraction")),
                  "of peak reserved never allocated at once")
        headroom = metrics.get("memory.headroom_fraction")
        total = evidence.get("device_total_bytes")
        t.add_row("headroom", _pct(headroom), f"of {_bytes(total)} device memory free at peak reserved" if total
                  else "device memory unknown (give --device-memory)")
    else:
        t.add_row("state", "dump-time state only", "no allocation history: peaks and OOMs not measured")
    t.add_row("largest free block", _bytes(metrics.get("memory.largest_free_block_bytes")), "cached, at dump time")
    if evidence.get("has_history", True):
        t.add_row("segment allocations", _count(metrics.get("memory.segment_allocs")),
                  f"cudaMalloc/map calls in the history; {evidence.get('segment_frees', 0):,} released")
        t.add_row("OOMs", _count(metrics.get("memory.oom_count")), "")
    t.add_row("segments at dump", f"{evidence.get('segment_count', 0):,}",
              f"{_bytes(evidence.get('reserved_at_dump_bytes'))} reserved, "
              f"{_bytes(evidence.get('allocated_at_dump_bytes'))} allocated")
    expandable = evidence.get("expandable_segments")
    conf = evidence.get("alloc_conf")
    t.add_row("expandable segments", {True: "on", False: "off"}.get(expandable, "unknown"),
              Text(f"PYTORCH_CUDA_ALLOC_CONF={conf!r} ({evidence.get('alloc_conf_source')})" if conf is not None
                   else ""))
    history = (f"{evidence.get('history_events', 0):,} events" + (
        f" over {evidence['history_span_us'] / 1e6:,.3f} s" if evidence.get("history_span_us") is not None else "")
        if evidence.get("has_history") else f"{evidence.get('history_events', 0):,} events, none an allocation")
    t.add_row("history", history, "")
    parts: list = [t]
    series = evidence.get("series") or {}
    if len(series.get("allocated") or []) > 1:
        parts.append(Text.assemble(("allocated over time  ", "bold"), _sparkline(series["allocated"])))
    for oom in (evidence.get("ooms") or [])[:1]:
        parts.append(Text.assemble(("out of memory", "bold red"), (
            f"  {_at(oom.get('time_us'), evidence) or ''}: {_bytes(oom['requested_bytes'])} requested, "
            f"{_bytes(oom['device_free_bytes'])} free on the device, allocator held {_bytes(oom['reserved_bytes'])} "
            f"({_bytes(oom['allocated_bytes'])} allocated)")))
        if oom.get("top_sites"):
            parts.append(_sites_table("holders at the first OOM", oom["top_sites"]))
    sites = evidence.get("top_sites") or []
    if sites:
        parts.append(_sites_table(f"top allocation sites at {evidence.get('top_sites_at', 'peak allocated')}", sites))
    return parts


def _sites_table(title: str, sites: list[dict[str, Any]]) -> Table:
    s = Table(title=title, title_justify="left", padding=(0, 1))
    s.add_column("bytes", justify="right")
    s.add_column("blocks", justify="right")
    s.add_column("site")
    for site in sites:
        where = site["file"] + (f":{site['line']}" if site.get("line") else "")
        s.add_row(_bytes(site["bytes"]), f"{site['count']:,}",
                  Text(where + (f"  {site['function']}" if site.get("function") else "")))
    return s


def _sparkline(values: list[int]) -> str:
    """The series squeezed to SPARK_WIDTH characters, each the maximum of its stretch."""
    n = len(values)
    width = min(SPARK_WIDTH, n)
    top = max(values) or 1
    cells = [max(values[i * n // width:max((i + 1) * n // width, i * n // width + 1)]) for i in range(width)]
    return "".join(SPARK[min(len(SPARK) - 1, max(0, v) * len(SPARK) // (top + 1))] for v in cells)


def _bytes(value: float | int | None) -> str:
    if value is None:
        return "—"
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    value, i = float(value), 0
    while abs(value) >= 1024 and i < len(units) - 1:
        value, i = value / 1024, i + 1
    return f"{value:,.0f} B" if i == 0 else f"{value:,.2f} {units[i]}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def _count(value: float | None) -> str:
    return "—" if value is None else f"{int(value):,}"


def _at(t_us: int | None, evidence: dict[str, Any]) -> str:
    return "" if t_us is None else "at " + history_time(t_us, evidence.get("history_start_us"))
