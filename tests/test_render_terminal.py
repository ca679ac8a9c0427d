"""Terminal output: user strings are never interpreted as rich markup, and lines fit the terminal."""

from __future__ import annotations

import shutil
import sqlite3

import pytest
from rich.console import Console

from perfdoctor import api
from perfdoctor.render.terminal import render_terminal
from tests.paths import SAMPLES

PROBE = "[bold red]evil[/bold red] [/] [link=http://x]k[/link]"


def test_markup_in_kernel_names_is_printed_literally(tmp_path):
    trace = tmp_path / "t.sqlite"
    shutil.copy(next((SAMPLES / "exposed_dp").glob("*.sqlite")), trace)
    with sqlite3.connect(trace) as conn:
        (sid,) = conn.execute("SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY shortName "
                              "ORDER BY sum(end - start) DESC LIMIT 1").fetchone()
        conn.execute("UPDATE StringIds SET value = ? WHERE id = ?", (PROBE, sid))
    conn.close()
    console = Console(width=200, record=True, color_system=None)
    render_terminal(api.analyze([trace]), console)
    text = console.export_text()
    assert "[bold red]evil[/bold red]" in text


def test_fits_an_80_column_terminal_and_shows_the_measurements():
    console = Console(width=80, record=True, color_system=None)
    render_terminal(api.analyze([SAMPLES / "ln_blocked"]), console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for needle in ("what blocked the step (critical path)", "per step (median over steps)", "DP comm",
                   "LayerNorm blocked by NCCL", "top kernels by time"):
        assert needle in text


def test_heuristic_group_labels_say_so():
    console = Console(width=120, record=True, color_system=None)
    render_terminal(api.analyze([SAMPLES / "real_h100"]), console)
    assert "[heuristic, low confidence]" in console.export_text()


def test_emoji_codes_in_names_print_as_written() -> None:
    """A kernel or NVTX range called ``:fire:`` is a name, not an emoji to substitute."""
    import io

    from perfdoctor.render.escape import safe_console

    out = io.StringIO()
    safe_console(file=out, width=80).print("kernel :fire: on :thumbs_up:")
    assert out.getvalue().strip() == "kernel :fire: on :thumbs_up:"


def test_blocking_lines_add_up_to_the_step() -> None:
    """One line per cause along the critical path, ms and % of the step, adding up to the step."""
    console = Console(width=120, record=True, color_system=None)
    report = api.analyze([SAMPLES / "exposed_dp"])
    render_terminal(report, console)
    text = console.export_text()
    block = text.split("what blocked the step (critical path)")[1].split("per step (median over steps)")[0]
    rows = [line.strip("│ ").split("│") for line in block.splitlines() if line.count("│") >= 4]
    ms = [float(r[1].strip().replace(",", "")) for r in rows if r[1].strip()[:1].isdigit()]
    assert "transfer.dp" in block and "compute.gemm" in block
    assert sum(ms) == pytest.approx(report.metrics["ranks"]["0"]["step.time_ms"], abs=0.01 * len(ms))
