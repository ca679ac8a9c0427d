"""``perfdoctor diff`` in the terminal: the verdict, finding changes, and the significant metrics."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from perfdoctor.diff import Diff
from perfdoctor.render.diff_markdown import basis_line, verdict_line

STYLE = {"worse": "red", "better": "green", "changed": "yellow", "same": ""}


def render_diff_terminal(diff: Diff, console: Console, show_all: bool = False) -> None:
    console.print(Text.assemble(("diff ", "bold"), diff.base_label, " → ", diff.head_label))
    console.print(Text(verdict_line(diff), style="bold red" if diff.step_regression_pct else "bold"))
    console.print(Text(f"basis: {basis_line(diff)}", style="dim"))
    for title, items in (("new", diff.new_findings), ("resolved", diff.resolved_findings)):
        for f in items:
            console.print(Text(f"  {title}: {f.get('rule', '')} ({f.get('severity', '')}) {f.get('summary', '')}"))
    for f, why in diff.gone_findings:
        console.print(Text(f"  no longer firing, not resolved: {f.get('rule', '')}: {why}"))
    for b, h in diff.changed_findings:
        console.print(Text(f"  changed: {h.get('rule', '')} {b.get('severity', '')} → {h.get('severity', '')}"))
    rows = diff.metrics if show_all else diff.significant
    if not rows:
        console.print("no metric changed beyond its noise estimate")
    else:
        t = Table(title="metrics" if show_all else "significant metric changes", title_justify="left")
        for col, justify in (("metric", "left"), ("base", "right"), ("head", "right"), ("delta", "right"),
                             ("noise ±", "right"), ("verdict", "left")):
            t.add_column(col, justify=justify, no_wrap=col != "metric", min_width=22 if col == "metric" else None,
                         overflow="fold")
        for m in rows:
            rel = "" if m.relative is None else f" ({100 * m.relative:+.1f} %)"
            t.add_row(Text(m.key), f"{m.base:,.4g}", f"{m.head:,.4g}", f"{m.delta:+,.4g}{rel}",
                      "–" if m.noise is None else f"{m.noise:,.3g}", Text(m.verdict, style=STYLE[m.verdict]))
        console.print(t)
    for n in diff.notes:
        console.print(Text(f"! {n}", style="yellow"))
