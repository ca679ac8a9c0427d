"""``perfdoctor mcp`` answers the MCP SDK's own stdio client: the server is started as a subprocess
(the installed console script under .ci/run), and each tool is called as an agent would call it; bad input
comes back as a tool error and the server keeps answering."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.paths import SAMPLES
from tests.test_docs_commands import _perfdoctor_on_path

if os.environ.get("PERFDOCTOR_TEST_INSTALLED") == "1":  # .ci/run installs the mcp extra: missing is a failure
    import mcp
else:
    mcp = pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install 'perfdoctor[mcp]')")


def _result(res: Any) -> Any:
    """A tool result's value: the structured content (unwrapped from {"result": ...}) or the text."""
    if res.structured_content is not None:
        value = res.structured_content
        return value["result"] if isinstance(value, dict) and set(value) == {"result"} else value
    return "".join(c.text for c in res.content if getattr(c, "type", "") == "text")


async def _session(env: dict[str, str], cwd: Path, calls: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], list]:
    params = mcp.StdioServerParameters(command="perfdoctor", args=["mcp"], env=env, cwd=str(cwd))
    async with mcp.stdio_client(params) as (read, write), mcp.ClientSession(read, write) as session:
        await session.initialize()
        tools = sorted(t.name for t in (await session.list_tools()).tools)
        results = [await session.call_tool(name, arguments) for name, arguments in calls]
    return tools, results


def test_the_sdk_client_drives_every_tool(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(SAMPLES / "clean_baseline", runs / "base")
    shutil.copytree(SAMPLES / "exposed_dp", runs / "head")
    before = sorted(p.name for p in runs.rglob("*"))
    cache = tmp_path / "cache"
    env = _perfdoctor_on_path(tmp_path / "bin") | {"XDG_CACHE_HOME": str(cache)}
    calls = [
        ("rules", {}),
        ("explain", {"rule_id": "exposed-dp-comm"}),
        ("explain", {"rule_id": "no-such-rule"}),
        ("analyze", {"paths": [str(runs / "missing.sqlite")]}),
        ("analyze", {"paths": [str(runs / "head")], "config": {"dp": 4}}),
        ("analyze", {"paths": [str(runs / "head")], "config": {"tpp": 2}}),
        ("diff", {"base": str(runs / "base"), "head": str(runs / "head")}),
    ]
    tools, results = asyncio.run(asyncio.wait_for(_session(env, tmp_path, calls), 600))
    assert tools == ["analyze", "diff", "explain", "rules"]
    rules, explained, unknown, missing, analysed, bad_config, diffed = results

    assert not rules.is_error and "exposed-dp-comm" in {r["id"] for r in _result(rules)}
    assert not explained.is_error and "exposed-dp-comm" in _result(explained)
    # bad input: the CLI's one line, as a tool error; the server answers the calls after it
    assert unknown.is_error and "unknown rule 'no-such-rule'" in _result(unknown)
    assert missing.is_error and "missing.sqlite" in _result(missing) and "Traceback" not in _result(missing)
    assert bad_config.is_error and "unknown config value(s) tpp" in _result(bad_config)

    assert not analysed.is_error, _result(analysed)
    report = _result(analysed)
    assert report["findings"][0]["rule"] == "exposed-dp-comm" and report["findings"][0]["knobs"]
    assert report["run"]["config"]["dp"] == 4 and report["metrics"]["step.time_ms"] > 0
    full = Path(report["report_path"])
    assert full.parent == cache / "perfdoctor" / "mcp"  # the full report: in the cache, not beside the inputs
    assert json.loads(full.read_text())["findings"][0]["rule"] == "exposed-dp-comm"
    assert sorted(p.name for p in runs.rglob("*")) == before

    assert not diffed.is_error, _result(diffed)
    d = _result(diffed)
    assert d["comparable"] and d["step_regression_pct"] > 0 and d["verdict"].startswith("Step time")
    assert any(m["key"] == "step.time_ms" for m in d["significant"])


def test_without_the_sdk_the_command_says_how_to_install_it(tmp_path):
    import subprocess
    import sys

    from tests.paths import REPO

    code = ("import sys; sys.modules['mcp'] = None\n"  # an import of mcp now fails as if not installed
            "sys.argv = ['perfdoctor', 'mcp']\n"
            "from perfdoctor.cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "perfdoctor: perfdoctor mcp needs the MCP SDK: pip install 'perfdoctor[mcp]'"
