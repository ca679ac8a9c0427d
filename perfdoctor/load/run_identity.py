"""One run at a time: tell when the inputs are several captures rather than the ranks of one.

A directory that holds two captures of the same job made an hour apart would otherwise become one
run with twice the ranks: ranks collide, a "straggler" is a rank of the other capture, and every
median mixes two configurations. Three independent signs say which files belong together:

* the ``perfdoctor capture`` manifest: every capture writes one ``manifest.json`` at the top of its run
  directory, so files under different manifests come from different captures;
* the world size in the capture hook's ``rank`` marks: ranks of one run agree on it;
* wall-clock time: the ranks of one run are captured concurrently, so the files' capture intervals
  (``TARGET_INFO_SESSION_START_TIME`` plus the last event) overlap; a file whose interval starts
  after all earlier ones ended, beyond clock skew between hosts, is another capture.

A mixed input is refused (exit 2) with one line listing the groups; ``--allow-mixed`` analyses it as
one run anyway, with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from perfdoctor.errors import InputError
from perfdoctor.load.labels import rank_mark
from perfdoctor.load.nsys_report import source_report
from perfdoctor.model import Run, Timeline, TimelineInfo, TraceInfo

# Hosts' clocks (NTP) agree to well under a second; 60 s also covers ranks whose launch was staggered.
CLOCK_SLACK_NS = 60 * 10**9
MANIFEST = "manifest.json"


@dataclass
class Capture:
    """Files judged to be one capture, and what identifies it."""

    files: list[Path] = field(default_factory=list)
    start_ns: int | None = None
    end_ns: int | None = None
    manifest: Path | None = None
    world: int | None = None
    hosts: set[str] = field(default_factory=set)

    def describe(self) -> str:
        files = sorted(self.files)
        names = ", ".join(p.name for p in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        parts = [names]
        if self.start_ns is not None:
            when = datetime.fromtimestamp(self.start_ns / 1e9, tz=timezone.utc)
            parts.append(f"started {when:%Y-%m-%d %H:%M:%S} UTC")
        if self.hosts:
            parts.append("host " + ",".join(sorted(self.hosts)))
        if self.world is not None:
            parts.append(f"world size {self.world}")
        if self.manifest is not None:
            parts.append(f"manifest {self.manifest}")
        return "; ".join(parts)


def split_captures(run: Run, inputs: list[Path]) -> list[Capture]:
    """The captures among the run's files, in order of start time (one element when they are one run)."""
    by_file: dict[Path, list[Timeline]] = {}
    for tl in run.timelines:
        by_file.setdefault(tl.trace.path, []).append(tl)
    keyed: dict[tuple[Path | None, int | None], list[tuple[TraceInfo, int | None, int | None]]] = {}
    for info in run.traces:
        timelines = by_file.get(info.path, [])
        worlds = {m["world"] for tl in timelines if (m := _rank_mark(tl)) and "world" in m}
        world = max(worlds) if worlds else None
        manifest = _manifest_of(info.path, inputs)
        start, end = _interval(info, timelines)
        keyed.setdefault((manifest, world), []).append((info, start, end))
    captures: list[Capture] = []
    for (manifest, world), members in keyed.items():
        for group in _overlapping(members):
            cap = Capture(manifest=manifest, world=world)
            for info, start, end in group:
                cap.files.append(info.path)
                if info.hostname:
                    cap.hosts.add(info.hostname)
                if start is not None:
                    cap.start_ns = start if cap.start_ns is None else min(cap.start_ns, start)
                    cap.end_ns = end if cap.end_ns is None else max(cap.end_ns, end)
            captures.append(cap)
    return sorted(captures, key=lambda c: (c.start_ns is None, c.start_ns or 0, str(c.files[0])))


def check_one_run(run: Run, inputs: list[Path], allow_mixed: bool) -> None:
    """Refuse inputs that are several captures (InputError listing them), or warn under --allow-mixed."""
    captures = split_captures(run, inputs)
    if len(captures) < 2:
        return
    groups = " | ".join(f"[{i}] {c.describe()}" for i, c in enumerate(captures, 1))
    if not allow_mixed:
        raise InputError(f"the inputs are {len(captures)} different captures, not one run: {groups}; "
                         "analyse them one at a time (or pass --allow-mixed)")
    run.warnings.append(f"--allow-mixed: {len(captures)} different captures analysed as one run: {groups}")


def _interval(info: TraceInfo, timelines: list[Timeline]) -> tuple[int | None, int | None]:
    """Wall-clock span of a file: session start plus its last event (event times are relative to it)."""
    if info.session_start_utc_ns is None:
        return None, None
    last = max((t for tl in timelines if (t := last_event_ns(tl)) is not None), default=0)
    return info.session_start_utc_ns, info.session_start_utc_ns + last


def last_event_ns(tl: Timeline | TimelineInfo) -> int | None:
    """The timeline's last event time (ns on its file's clock); a TimelineInfo carries it."""
    if isinstance(tl, TimelineInfo):
        return tl.last_event_ns
    last = None
    for frame in (tl.kernels, tl.nvtx, tl.api, tl.memcpy):
        if len(frame):
            here = max(int(frame["end"].max()), int(frame["start"].max()))
            last = here if last is None else max(last, here)
    return last


def _rank_mark(tl: Timeline | TimelineInfo) -> dict[str, int] | None:
    return tl.rank_mark if isinstance(tl, TimelineInfo) else rank_mark(tl)


def _overlapping(members: list[tuple[TraceInfo, int | None, int | None]]):
    """Groups of files whose capture intervals overlap (within the clock slack); files without a
    session start join the first group (nothing says they are apart)."""
    timed = sorted((m for m in members if m[1] is not None), key=lambda m: m[1])
    untimed = [m for m in members if m[1] is None]
    groups: list[list] = []
    end = None
    for m in timed:
        if groups and m[1] <= end + CLOCK_SLACK_NS:
            groups[-1].append(m)
            end = max(end, m[2])
        else:
            groups.append([m])
            end = m[2]
    if untimed:
        if not groups:
            groups.append([])
        groups[0].extend(untimed)
    return groups


def _manifest_of(path: Path, inputs: list[Path]) -> Path | None:
    """The nearest manifest.json above a file, looking no higher than the input it was found under."""
    roots = [p.resolve() for p in inputs if p.is_dir()]
    folder = (source_report(path) or path).resolve().parent
    while True:
        candidate = folder / MANIFEST
        if candidate.is_file() and _is_manifest(candidate):
            return candidate
        if folder in roots or not any(folder.is_relative_to(r) for r in roots) or folder.parent == folder:
            return None
        folder = folder.parent


def _is_manifest(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
        return head.lstrip().startswith(b"{") and b'"manifest_version"' in head
    except OSError:
        return False
