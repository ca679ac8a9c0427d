"""The Perfetto timeline: Chrome Trace Event Format JSON of what blocked the step (``--perfetto FILE``).

Perfetto (ui.perfetto.dev), chrome://tracing and most trace viewers open this format. One process per
rank (per run and rank for a diff: the base above the head), on the run's aligned clock
(:class:`perfdoctor.measure.trace_excerpt.RunTrace`; µs from the earliest drawn event of the run). Tracks,
top to bottom:

- **critical path**: the report's ``path`` (DESIGN §5: per rank, each segment's cause and what it is) when
  the report has one; otherwise what the measurements say blocks the step: exposed communication per group,
  pipeline bubbles or device-side waits, LayerNorms blocked behind NCCL (the track's name says which);
- **findings**: one track per finding, its slices spanning the time it explains (the highlights of the
  metric its evidence names), or the whole drawn step when no interval of the step is its evidence;
- **waits for peers**: each wait for a later member of a collective, with a flow arrow to the rank that
  arrived last (its **arrivals** track), both on the aligned clock;
- the launching thread: **CUDA API** calls, **NVTX** ranges, **host gaps** labelled with their cause;
- one track per stream: kernels (category, parallel group, merged count in ``args``), and its copies.

Only what the Report carries is drawn: this module formats, it measures nothing. Slices on one track are
kept properly nested (a slice that would cross another goes to a second lane of the same name), events
are sorted per track, and every process and thread is named (``process_name`` / ``thread_name``
metadata), so the file is valid for strict readers too.
"""

from __future__ import annotations

import json
from typing import Any

NS_PER_US = 1e3
UTC_NS = 10**17  # a path time above this is on the UTC (session) clock already, below on the rank's file clock
MAX_FINDING_SLICES = 200  # per finding and rank
# A finding's evidence metric → the highlights (kind, label or None for any) that are its time.
HOST_CAUSES = ("launch_bound", "sync", "gc", "data")
BLOCKING_KINDS = ("exposed_comm", "bubble", "device_wait", "ln_blocked")
# Track order inside a rank's process (Perfetto sorts threads by this index).
ORDER = {"critical path": 0, "findings": 1, "waits for peers": 2, "arrivals": 3, "CUDA API": 4, "NVTX": 5,
         "host gaps": 6, "stream": 10}


def render_perfetto(sides: list[tuple[str, dict[str, Any], Any]]) -> str:
    """The trace JSON of one run (``[("", report, run_trace)]``) or of a diff (base, head: one above the
    other). ``report`` is the JSON report dict; ``run_trace`` its RunTrace (None for a saved report: then
    only the path and findings are drawn, on the path's own times)."""
    out = _Trace()
    meta: dict[str, Any] = {"producer": "perfdoctor", "runs": []}
    for side, (label, report, trace) in enumerate(sides):
        meta["runs"].append(out.add_run(side, label, report, trace))
    meta["events"] = len(out.events)
    return json.dumps({"traceEvents": out.sorted_events(), "displayTimeUnit": "ms", "metadata": meta},
                      separators=(",", ":"), allow_nan=False, default=str) + "\n"


class _Trace:
    """Events under construction, with a tid per (pid, track name, lane)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.meta: list[dict[str, Any]] = []
        self.tids: dict[tuple[int, str], int] = {}
        self.flow = 0

    # -- one run -----------------------------------------------------------------------------------------
    def add_run(self, side: int, label: str, report: dict[str, Any], trace: Any) -> dict[str, Any]:
        excerpts = dict(trace.excerpts) if trace is not None else {}
        clock = dict(trace.clock_ns) if trace is not None else {}
        paths = _paths(report)
        ranks = sorted(set(excerpts) | set(paths) | {r for f in report.get("findings") or [] for r in _ranks(f)}
                       | ({int(r) for r in (report.get("metrics") or {}).get("ranks", {})} if not excerpts else set()))
        origin = self._origin(excerpts, clock, paths)
        prefix = f"{label} · " if label else ""
        pids = {}
        for r in ranks:
            pid = 1 + side * 100_000 + r
            pids[r] = pid
            self.meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                              "args": {"name": f"{prefix}rank {r}"}})
            self.meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                              "args": {"sort_index": side * 100_000 + r}})
        at = _Clock(origin, clock)
        for r, ex in excerpts.items():
            self._excerpt(pids[r], r, ex, at)
        self._path(pids, paths, excerpts, at)
        self._findings(pids, report, excerpts, at)
        if trace is not None:
            self._waits(pids, trace.waits, at)
        return {"label": label or "run", "ranks": ranks, "origin_utc_ns": origin,
                "clock_residual_us": trace.clock_residual_us if trace is not None else None,
                "clock": {str(r): trace.clock_source.get(r) for r in excerpts} if trace is not None else {},
                "steps_drawn": {str(r): {"step": ex.kernels.step_index, "of": ex.kernels.step_count,
                                         "pixel_us": ex.kernels.pixel_us, "kernels": ex.kernels.kernels,
                                         "dropped": ex.dropped} for r, ex in excerpts.items()},
                "path": "report" if paths else "measured (no blocking path in the report)" if excerpts else "none"}

    @staticmethod
    def _origin(excerpts: dict[int, Any], clock: dict[int, int], paths: dict[int, list[dict[str, Any]]]) -> int:
        starts = [ex.kernels.step_start_ns + clock.get(r, 0) for r, ex in excerpts.items()]
        starts += [_path_ns(s["start_ns"], r, clock) for r, segs in paths.items() for s in segs]
        return min(starts) if starts else 0

    def _excerpt(self, pid: int, rank: int, ex: Any, at: _Clock) -> None:
        k = ex.kernels
        base = k.step_start_ns

        def us(rel_us: float) -> float:
            return at.us(rank, base + round(rel_us * NS_PER_US))

        streams: dict[tuple[str, int], list[tuple[float, float, str, str, dict[str, Any]]]] = {}
        for rect in k.rects:
            args = {"category": rect["category"], "group": rect.get("group"), "kernels": rect["count"]}
            streams.setdefault((f"stream {rect['stream']}", rect["stream"]), []).append(
                (us(rect["start_us"]), us(rect["end_us"]), _count_name(rect), rect["category"], args))
        for row in ex.copies:
            streams.setdefault((f"stream {row['stream']} · copies", row["stream"]), []).append(
                (us(row["start_us"]), us(row["end_us"]), _count_name(row), "copy",
                 {"category": row["category"], "copies": row["count"]}))
        for (track, stream), rows in sorted(streams.items()):
            self.slices(pid, track, ORDER["stream"] + stream, rows)
        thread = f"{ex.thread_name or 'thread'} {ex.launch_tid}" if ex.launch_tid >= 0 else "launching thread"
        self.slices(pid, f"{thread} · CUDA API", ORDER["CUDA API"],
                    [(us(c["start_us"]), us(c["end_us"]), _count_name(c), "cuda_api", {"calls": c["count"]})
                     for c in ex.calls])
        self.slices(pid, f"{thread} · NVTX", ORDER["NVTX"],
                    [(us(r["start_us"]), us(r["end_us"]), r["text"], "nvtx", {}) for r in ex.ranges])
        self.slices(pid, f"{thread} · host gaps", ORDER["host gaps"],
                    [(us(h["start_us"]), us(h["end_us"]), f"host gap: {h['label']}", "host_gap",
                      {"cause": h["label"], "device": "idle"}) for h in k.highlights if h["kind"] == "host_gap"])
        step_end = us(k.step_ms * 1e3)
        self.slices(pid, "steps", -1, [(us(0), step_end, f"step {k.step_index} of {k.step_count} (drawn)", "step",
                                       {"step_ms": k.step_ms, "kernels": k.kernels, "merge_us": k.pixel_us})])

    def _path(self, pids: dict[int, int], paths: dict[int, list[dict[str, Any]]], excerpts: dict[int, Any],
              at: _Clock) -> None:
        for r, segs in paths.items():
            self.slices(pids[r], "critical path", ORDER["critical path"],
                        [(at.path(r, s["start_ns"]), at.path(r, s["end_ns"]),
                          str(s.get("cause")), "critical_path",
                          {"cause": s.get("cause"), "what": s.get("what"), "inferred": bool(s.get("inferred")),
                           "rank": s.get("rank", r)}) for s in segs])
        for r, ex in excerpts.items():
            if r in paths:
                continue
            rows = [h for h in ex.kernels.highlights if h["kind"] in BLOCKING_KINDS]
            self.slices(pids[r], "critical path (measured: exposed comm, bubbles, blocked norms)",
                        ORDER["critical path"], [(*self._span(r, ex, h, at), _highlight_name(h), h["kind"],
                                                  {"kind": h["kind"], "label": h["label"]}) for h in rows])

    def _findings(self, pids: dict[int, int], report: dict[str, Any], excerpts: dict[int, Any], at: _Clock) -> None:
        for f in report.get("findings") or []:
            args = {"rule": f.get("rule"), "severity": f.get("severity"), "confidence": f.get("confidence"),
                    "summary": f.get("summary"), "impact_ms_per_step": f.get("impact_ms_per_step")}
            name = f"{f.get('rule')}: {f.get('title')}"
            for r in _ranks(f) or sorted(pids):
                if r not in pids:
                    continue
                ex = excerpts.get(r)
                rows: list[tuple[float, float]] = []
                if ex is not None:
                    kinds = _finding_kinds(f)
                    rows = [self._span(r, ex, h, at) for h in ex.kernels.highlights if _matches(h, kinds)]
                    rows = rows[:MAX_FINDING_SLICES] or [(at.us(r, ex.kernels.step_start_ns),
                                                          at.us(r, ex.kernels.step_start_ns
                                                                + round(ex.kernels.step_ms * 1e6)))]
                else:
                    segs = _paths(report).get(r) or []
                    rows = [(at.path(r, segs[0]["start_ns"]), at.path(r, segs[-1]["end_ns"]))] if segs else [(0.0, 0.0)]
                self.slices(pids[r], f"finding: {f.get('rule')}", ORDER["findings"],
                            [(a, b, name, "finding", args) for a, b in rows])

    def _waits(self, pids: dict[int, int], waits: list[dict[str, Any]], at: _Clock) -> None:
        waits = [w for w in waits if w["rank"] in pids and w["late"] in pids]
        arrivals = sorted({(w["late"], w["late_ns"], w["group"]) for w in waits})
        arrival_tid: dict[tuple[int, int], int] = {}
        for late in sorted({a[0] for a in arrivals}):
            mine = [a for a in arrivals if a[0] == late]
            tids = self.slices(pids[late], "arrivals", ORDER["arrivals"],
                               [(at.us_aligned(ns), at.us_aligned(ns), f"arrived last ({g})", "peer_wait",
                                 {"group": g}) for _, ns, g in mine])
            arrival_tid.update({(late, ns): tid for (_, ns, _), tid in zip(mine, tids)})
        for rank in sorted({w["rank"] for w in waits}):
            mine = [w for w in waits if w["rank"] == rank]
            tids = self.slices(pids[rank], "waits for peers", ORDER["waits for peers"],
                               [(at.us_aligned(w["start_ns"]), at.us_aligned(w["end_ns"]),
                                 f"waiting for rank {w['late']} ({w['group']})", "peer_wait",
                                 {"late_rank": w["late"], "group": w["group"],
                                  "wait_us": round((w["end_ns"] - w["start_ns"]) / NS_PER_US, 3)}) for w in mine])
            for w, tid in zip(mine, tids):
                self.flow += 1
                common = {"name": "waited for", "cat": "peer_wait", "id": self.flow}
                self.events.append({**common, "ph": "s", "pid": pids[rank], "tid": tid,
                                    "ts": at.us_aligned(w["start_ns"])})
                self.events.append({**common, "ph": "f", "bp": "e", "pid": pids[w["late"]],
                                    "tid": arrival_tid[(w["late"], w["late_ns"])], "ts": at.us_aligned(w["late_ns"])})

    @staticmethod
    def _span(rank: int, ex: Any, h: dict[str, Any], at: _Clock) -> tuple[float, float]:
        base = ex.kernels.step_start_ns
        return (at.us(rank, base + round(h["start_us"] * NS_PER_US)),
                at.us(rank, base + round(h["end_us"] * NS_PER_US)))

    # -- tracks --------------------------------------------------------------------------------------------
    def slices(self, pid: int, track: str, order: int,
               rows: list[tuple[float, float, str, str, dict[str, Any]]]) -> list[int]:
        """Complete ("X") slices on a track, each in the first lane where it nests (lanes are tracks of the
        same name); returns each row's tid, in the order of ``rows``."""
        lanes: list[list[float]] = []  # per lane, the ends of its open slices (a stack)
        tids = [0] * len(rows)
        self._tid(pid, track, 0, order)  # the track is named even when empty
        for i in sorted(range(len(rows)), key=lambda i: (rows[i][0], -rows[i][1])):
            ts, end, name, cat, args = rows[i]
            end = max(end, ts)
            lane = next((j for j, stack in enumerate(lanes) if _nests(stack, ts, end)), len(lanes))
            if lane == len(lanes):
                lanes.append([])
            lanes[lane].append(end)
            tids[i] = self._tid(pid, track, lane, order)
            self.events.append({"ph": "X", "pid": pid, "tid": tids[i], "ts": ts, "dur": round(end - ts, 3),
                                "name": name, "cat": cat, "args": {k: v for k, v in args.items() if v is not None}})
        return tids

    def _tid(self, pid: int, track: str, lane: int, order: int) -> int:
        name = track if lane == 0 else f"{track} ({lane + 1})"
        key = (pid, name)
        if key not in self.tids:
            tid = len(self.tids) + 1
            self.tids[key] = tid
            self.meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            self.meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                              "args": {"sort_index": order * 100 + lane}})
        return self.tids[key]

    def sorted_events(self) -> list[dict[str, Any]]:
        return self.meta + sorted(self.events, key=lambda e: (e["pid"], e["tid"], e["ts"], -e.get("dur", 0)))


def _nests(stack: list[float], ts: float, end: float) -> bool:
    """Whether a slice [ts, end] nests in a lane whose open slices end at ``stack`` (those ended by ``ts``
    are closed first: slices come in start order)."""
    while stack and stack[-1] <= ts:
        stack.pop()
    return not stack or end <= stack[-1]


class _Clock:
    """Rank file-clock ns → µs from the run's origin on the aligned clock."""

    def __init__(self, origin: int, clock: dict[int, int]) -> None:
        self.origin, self.clock = origin, clock

    def us(self, rank: int, ns: int) -> float:
        return self.us_aligned(ns + self.clock.get(rank, 0))

    def us_aligned(self, ns: int) -> float:
        return round((ns - self.origin) / NS_PER_US, 3)

    def path(self, rank: int, ns: int) -> float:
        """A path time (file clock or UTC, see UTC_NS) in µs from the origin."""
        return self.us_aligned(_path_ns(ns, rank, self.clock))


def _path_ns(ns: int, rank: int, clock: dict[int, int]) -> int:
    """A path time on the rank's aligned clock: file-clock times get the rank's clock added (see UTC_NS)."""
    return int(ns) if int(ns) >= UTC_NS else int(ns) + clock.get(rank, 0)


def _paths(report: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """The report's ``path`` per rank (DESIGN §5), whether given as {rank: [...]} or as one list."""
    path = report.get("path")
    out: dict[int, list[dict[str, Any]]] = {}
    if isinstance(path, dict):
        for r, segs in path.items():
            out.setdefault(int(r), []).extend(s for s in segs or [] if isinstance(s, dict))
    elif isinstance(path, list):
        for s in path:
            if isinstance(s, dict) and s.get("rank") is not None:
                out.setdefault(int(s["rank"]), []).append(s)
    return {r: sorted(segs, key=lambda s: s["start_ns"]) for r, segs in out.items() if segs}


def _ranks(finding: dict[str, Any]) -> list[int]:
    return [int(r) for r in finding.get("ranks") or [] if isinstance(r, int) or str(r).isdigit()]


def _finding_kinds(finding: dict[str, Any]) -> set[tuple[str, str | None]]:
    """The highlights (kind, label; None: any label) that are the time a finding explains, from the metric
    names of its evidence."""
    kinds: set[tuple[str, str | None]] = set()
    for metric in finding.get("evidence") or {}:
        parts = metric.split(".")
        if parts[0] == "comm" and len(parts) > 2 and "exposed" in parts[2]:
            kinds.add(("exposed_comm", parts[1]))
        elif metric.startswith("comm.exposed"):
            kinds.add(("exposed_comm", None))
        elif parts[0] == "host" and len(parts) > 1:
            cause = parts[1].removesuffix("_ms")
            kinds.add(("host_gap", cause if cause in HOST_CAUSES else None))
        elif parts[0] == "pipeline" and "bubble" in metric:
            kinds.update({("bubble", None), ("device_wait", None)})
        elif parts[0] == "ln":
            kinds.add(("ln_blocked", None))
    return kinds


def _matches(h: dict[str, Any], kinds: set[tuple[str, str | None]]) -> bool:
    return (h["kind"], None) in kinds or (h["kind"], h["label"]) in kinds


def _highlight_name(h: dict[str, Any]) -> str:
    if h["kind"] == "exposed_comm":
        return f"exposed {h['label']} comm"
    if h["kind"] == "ln_blocked":
        return f"norm blocked by NCCL: {h['label']}"
    return h["label"]


def _count_name(row: dict[str, Any]) -> str:
    return row["name"] if row["count"] <= 1 else f"{row['name']} (+{row['count'] - 1} merged)"
