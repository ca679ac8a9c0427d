"""GitHub-flavoured Markdown for a pull-request comment: findings first, details collapsed.

A PR comment holds at most 65,536 characters; the report stays under ``MAX_CHARS`` by cutting the
longest tables first and saying so. GitHub renders HTML inside Markdown, so every user string
(kernel names, paths, NVTX text, environment values) goes through :mod:`perfdoctor.render.escape`:
:func:`md` (HTML-escaped, Markdown punctuation backslash-escaped, mentions broken), a code span or a
code block fenced longer than any backtick run it contains.
"""

from __future__ import annotations

from perfdoctor.model import Report
from perfdoctor.render import scale
from perfdoctor.render import summary as sm
from perfdoctor.render.escape import code_block, code_span, md
from perfdoctor.render.snippets import knob_snippets

MAX_CHARS = 60_000
SEVERITY_ICON = {"high": "🔴", "medium": "🟠", "low": "🔵", "info": "⚪"}


def render_markdown(report: Report, title: str | None = None) -> str:
    """The PR-comment report; shorter than MAX_CHARS characters."""
    for top_kernels in (15, 5, 0):
        text = _render(report, title, top_kernels, per_rank=top_kernels > 0)
        if len(text) < MAX_CHARS:
            return text
    return text[: MAX_CHARS - 80].rsplit("\n", 1)[0] + "\n\n_(report cut to fit a PR comment)_\n"


def _render(report: Report, title: str | None, top_kernels: int, per_rank: bool) -> str:
    all_m = report.metrics.get("all", {})
    out = [f"## perfdoctor · {md(title or scale.run_name(report))}", ""]
    out.append(f"**step time {sm.fmt(all_m.get('step.time_ms'), 'ms')}** (median over steps, p90 "
               f"{sm.fmt(all_m.get('step.time_p90_ms'), 'ms')}) · MFU {sm.fmt(all_m.get('mfu'), '%')} · "
               f"GPU busy {sm.fmt(all_m.get('gpu.busy_fraction'), '%')} · exposed comm "
               f"{sm.fmt(all_m.get('comm.exposed_fraction'), '%')} of the step · "
               f"{len(report.devices)} device(s)")
    out.append("")
    out += _findings(report)
    out += _details("What blocked the step (critical path of the median step)", _blocking(report, per_rank))
    out += _details("Step-time breakdown per rank", _breakdown(report) if per_rank else ["_(cut for length)_"])
    out += _details("Communication per parallel group", _comm(report, per_rank))
    out += _details("Host gaps and LayerNorm blocking", _host(report, per_rank))
    if top_kernels:
        out += _details("Top kernels", _kernels(report, top_kernels))
    if report.warnings:
        out += _details(f"Warnings ({len(report.warnings)})", [f"- {md(w)}" for w in report.warnings])
    inputs = [f"- {code_span(t.path)} · " + (md(t.producer) if t.format != "nsys-sqlite" else
              f"nsys {md(t.nsys_version or '?')} · export schema {md(t.schema_version or '?')}")
              for t in report.run.traces[:scale.MANY_RANKS]]
    if len(report.run.traces) > scale.MANY_RANKS:
        inputs.append(f"- … and {len(report.run.traces) - scale.MANY_RANKS} more traces")
    out += _details("Inputs", inputs)
    out.append(f"<sub>perfdoctor {md(report.tool_version)}</sub>")
    return "\n".join(out) + "\n"


def _findings(report: Report) -> list[str]:
    found = sm.findings(report)
    if not found:
        return ["No findings: no rule fired on this run.", ""]
    out = ["### Findings", "", "| | finding | confidence | ms per step | knob |", "|---|---|---|---:|---|"]
    for f in found:
        knobs = [k for k in f.get("knobs") or [] if isinstance(k, dict)]
        knob = md(sm.knob_label(knobs[0])) if knobs else "–"
        out.append(f"| {SEVERITY_ICON.get(f.get('severity'), '')} {md(f.get('severity', ''))} | "
                   f"**{md(f.get('title', f.get('rule', '')))}** — {md(f.get('summary', ''))} | "
                   f"{md(f.get('confidence', '–'))} | {sm.fmt(f.get('impact_ms_per_step'), 'ms')} | {knob} |")
    total = sm.total_impact_ms(report)
    if total is not None:
        out += ["", f"Together: {sm.fmt(total, 'ms')} per step (overlapping findings counted once)."]
    framework = report.run.framework
    out += ["", f"Framework: {md(framework.get('name'))} ({md(framework.get('source'))}).", ""]
    for f in found:
        body = []
        if f.get("ranks"):
            body.append(f"Ranks: {md(', '.join(str(r) for r in f['ranks']))}")
        body.append(md(sm.confidence_text(f)))
        if sm.overlap_text(f):
            body.append(md(sm.overlap_text(f)))
        if f.get("advice"):
            body.append(f"Fix: {md(f['advice'])}")
        if f.get("guide"):
            body.append(f"Guide: {md(f['guide'])}")
        if f.get("next_step"):
            body.append(f"Next step: {md(f['next_step'])}")
        if isinstance(f.get("evidence"), dict) and f["evidence"]:
            body += ["", "| evidence | value |", "|---|---|"]
            body += [f"| {md(k)} | {md(v)} |" for k, v in sorted(f["evidence"].items())]
        knobs = [k for k in f.get("knobs") or [] if isinstance(k, dict)]
        fixes = [k for k in knobs if k.get("role") != "reference"]
        if fixes:
            body += ["", md(sm.knobs_heading(f, framework, "fix")) + ":"]
        body += _knob_lines(fixes)
        reference = [k for k in knobs if k.get("role") == "reference"]
        if reference:  # not the fix for this run: collapsed
            body += ["", *_details(md(sm.reference_line(f).replace("`", "")),  # raw HTML: no code span
                                   [md(sm.knobs_heading(f, framework, "reference")) + ".",
                                    *_knob_lines(reference)])]
        if body:
            out += _details(f"{md(f.get('rule', ''))}: details and how to fix", body)
    return out


def _knob_lines(knobs: list[dict]) -> list[str]:
    body: list[str] = []
    for knob in knobs:
        for extra in (knob.get("note"), sm.what_if_text(knob)):
            if extra:
                body += ["", md(extra)]
        for s in knob_snippets(knob):
            body += ["", f"{s.label}:", "", code_block(s.code, s.language)]
    return body


def _details(summary: str, body: list[str]) -> list[str]:
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "", "</details>", ""]


def _shown_ranks(report: Report) -> list[str]:
    """Every rank, or for a run of many ranks the ones that stand out (render/scale.py)."""
    if not scale.many(report):
        return sm.ranks(report)
    return [r for r, _ in scale.outliers(report, scale.MANY_RANKS)]


def _left_out(report: Report) -> list[str]:
    hidden = len(report.metrics.get("ranks", {})) - len(_shown_ranks(report))
    return ["", f"_{hidden} ranks within the spread of these are not listed (all of them: --format json)._"] \
        if hidden > 0 else []


def _breakdown(report: Report) -> list[str]:
    rows = {r: dict(sm.breakdown(report.metrics["ranks"][r])) for r in _shown_ranks(report)}
    parts = [p for p in ("compute", *(f"exposed {g.upper()}" for g in sm.GROUPS), "exposed comm (unlabelled)",
                         "device idle", "other") if any(p in row for row in rows.values())]
    if not parts:
        return ["No per-step measurements."]
    out = ["| rank | step ms | " + " | ".join(parts) + " |", "|---:|---:|" + "---:|" * len(parts)]
    for r, row in rows.items():
        step = report.metrics["ranks"][r].get("step.time_ms")
        out.append(f"| {md(r)} | {sm.fmt(step, 'ms')} | " +
                   " | ".join(sm.fmt(row.get(p), "ms") if p in row else "–" for p in parts) + " |")
    return out + _left_out(report)


def _blocking(report: Report, per_rank: bool) -> list[str]:
    """Per rank one line per cause along its critical path: ms and % of the step, adding up to the step."""
    out = ["| rank | cause | ms/step | % of step |", "|---:|---|---:|---:|"]
    keys = _shown_ranks(report) if per_rank else ["all"]
    for r in keys:
        m = report.metrics["all"] if r == "all" else report.metrics["ranks"][r]
        for cause, ms, share in sm.blocking(m):
            out.append(f"| {md(r)} | {md(cause)} | {ms:,.2f} | {100 * share:.1f} % |")
    if len(out) == 2:
        return ["No critical path (no steps on a device)."]
    return out + (["", "_all: each cause's median over ranks (they need not add up; each rank's do)._"]
                  if "all" in keys else _left_out(report))


def _comm(report: Report, per_rank: bool) -> list[str]:
    out = ["| rank | group | comm ms/step | exposed ms/step | exposed % of step |", "|---:|---|---:|---:|---:|"]
    keys = _shown_ranks(report) if per_rank else ["all"]
    for r in keys:
        m = report.metrics["all"] if r == "all" else report.metrics["ranks"][r]
        for g in sm.GROUPS:
            if m.get(f"comm.{g}.time_ms"):
                out.append(f"| {md(r)} | {g.upper()} | {sm.fmt(m[f'comm.{g}.time_ms'], 'ms')} | "
                           f"{sm.fmt(m.get(f'comm.{g}.exposed_ms'), 'ms')} | "
                           f"{sm.fmt(m.get(f'comm.{g}.exposed_fraction'), '%')} |")
    return out if len(out) > 2 else ["No communication labelled by parallel group."]


def _host(report: Report, per_rank: bool) -> list[str]:
    labels = [label for _, label in sm.HOST_CAUSES]
    out = ["| rank | device idle % | " + " | ".join(labels) + " | LN blocked/step | LN delay |",
           "|---:|---:|" + "---:|" * (len(labels) + 2)]
    keys = _shown_ranks(report) if per_rank else ["all"]
    for r in keys:
        m = report.metrics["all"] if r == "all" else report.metrics["ranks"][r]
        cells = [sm.fmt(m.get(f"host.{c}_ms"), "ms") for c, _ in sm.HOST_CAUSES]
        count = m.get("ln.blocked_count")
        out.append(f"| {md(r)} | {sm.fmt(m.get('host.idle_fraction'), '%')} | " + " | ".join(cells) +
                   f" | {'–' if count is None else f'{count:.0f}'} | {sm.fmt(m.get('ln.blocked_ms'), 'ms')} |")
    return out


def _kernels(report: Report, n: int) -> list[str]:
    merged: dict[tuple[str, str], list[int]] = {}
    for d in report.devices:
        for k in d.top_kernels:
            acc = merged.setdefault((k["name"], k["category"]), [0, 0])
            acc[0] += k["count"]
            acc[1] += k["ns"]
    rows = sorted(merged.items(), key=lambda kv: -kv[1][1])[:n]
    out = ["| kernel | category | count | ms |", "|---|---|---:|---:|"]
    out += [f"| {code_span(name[:160])} | {md(cat)} | {cnt:,} | {ns / 1e6:,.2f} |"
            for (name, cat), (cnt, ns) in rows]
    return out

