"""``perfdoctor diff`` as GitHub-flavoured Markdown for a PR comment: verdict, findings, then metrics.

Only significant deltas are listed in the open; the full table is collapsed. User strings go
through :mod:`perfdoctor.render.escape` (metric keys of saved
reports too: they are user data).
"""

from __future__ import annotations

from perfdoctor.diff import Diff, MetricDelta
from perfdoctor.render.escape import code_span, md
from perfdoctor.render.markdown import MAX_CHARS

VERDICT_ICON = {"worse": "🔺", "better": "✅", "changed": "↔️", "same": ""}


def verdict_line(diff: Diff) -> str:
    """One sentence: did the step time (or, per unit of work, the time per unit) change beyond noise?"""
    if not diff.basis.comparable:
        return f"Not comparable: {diff.basis.reason}."
    s = diff.step
    what, prefix = "step time", ""
    if diff.basis.kind == "per unit of work":
        what = f"time per unit of work ({diff.basis.unit})"
    elif diff.basis.kind == "periodic steps":
        prefix = "Steps from periodic structure. "
    if s is None:
        return f"{prefix}{what[0].upper()}{what[1:]} could not be compared (missing on one side)."
    fmt = ",.2f" if s.key == "step.time_ms" else ",.4g"  # a unit of work is about 1 ms
    change = f"{s.base:{fmt}} ms → {s.head:{fmt}} ms ({_signed_pct(s)})"
    noise = f"threshold ±{s.threshold:{fmt}} ms"
    if not s.significant:
        what = "step-time change" if what == "step time" else f"change in {what}"
        return f"{prefix}No significant {what}: {change}, within noise ({noise})."
    word = "slower (regression)" if s.delta > 0 else "faster"
    return f"{prefix}{what[0].upper()}{what[1:]} {word}: {change}, beyond noise ({noise})."


def basis_line(diff: Diff) -> str:
    """What the two runs were compared on (DESIGN §3 steps), in words."""
    b = diff.basis
    if b.kind == "per unit of work":
        return f"{b.kind} ({b.unit})"
    return b.kind + (f" — {b.reason}" if b.comparable else "")


def _verdict_md(diff: Diff) -> str:
    """The verdict as Markdown: escaped where it quotes kernel names (per unit of work, not comparable)."""
    line = verdict_line(diff)
    return md(line) if diff.basis.unit or not diff.basis.comparable else line


def render_diff_markdown(diff: Diff) -> str:
    out = [f"## perfdoctor diff · {md(diff.base_label)} → {md(diff.head_label)}", "", f"**{_verdict_md(diff)}**",
           "", f"Basis: {md(basis_line(diff))}", ""]
    out += _findings(diff)
    sig = diff.significant
    if sig:
        out += ["### Significant metric changes", "", *_table(sig), ""]
    else:
        out += ["No metric changed beyond its noise estimate.", ""]
    out += ["<details>", f"<summary>All compared metrics ({len(diff.metrics)})</summary>", "", *_table(diff.metrics),
            "", "</details>", ""]
    if diff.notes:
        out += [f"> {md(n)}" for n in diff.notes] + [""]
    text = "\n".join(out) + "\n"
    if len(text) >= MAX_CHARS:  # drop the collapsed table first
        cut = out.index("<details>")
        text = "\n".join(out[:cut] + ["_(full metric table cut to fit a PR comment)_"]) + "\n"
    return text


def _findings(diff: Diff) -> list[str]:
    out = []
    for title, items in (("New findings", diff.new_findings), ("Resolved findings", diff.resolved_findings)):
        if items:
            out += [f"### {title}", ""]
            out += [f"- **{md(f.get('rule', ''))}** ({md(f.get('severity', ''))}): {md(f.get('summary', ''))}"
                    for f in items]
            out.append("")
    if diff.gone_findings:
        out += ["### No longer firing, not resolved", ""]
        out += [f"- **{md(f.get('rule', ''))}**: {md(why)}" for f, why in diff.gone_findings]
        out.append("")
    if diff.changed_findings:
        out += ["### Changed findings", ""]
        for b, h in diff.changed_findings:
            out.append(f"- **{md(h.get('rule', ''))}**: {md(b.get('severity', ''))} → {md(h.get('severity', ''))}, "
                       f"impact {_ms(b.get('impact_ms_per_step'))} → {_ms(h.get('impact_ms_per_step'))} per step")
        out.append("")
    return out or ["No finding appeared, disappeared or changed.", ""]


def _table(rows: list[MetricDelta]) -> list[str]:
    out = ["| metric | base | head | delta | noise ± | verdict |", "|---|---:|---:|---:|---:|---|"]
    for m in rows:
        noise = "–" if m.noise is None else f"{m.noise:,.4g}"
        out.append(f"| {code_span(m.key)} | {m.base:,.4g} | {m.head:,.4g} | {m.delta:+,.4g} ({_signed_pct(m)}) "
                   f"| {noise} | "
                   f"{VERDICT_ICON[m.verdict]} {m.verdict} |")
    return out


def _signed_pct(m: MetricDelta) -> str:
    return "n/a" if m.relative is None else f"{100 * m.relative:+.1f} %"


def _ms(v: object) -> str:
    return f"{v:,.2f} ms" if isinstance(v, (int, float)) else "–"
