"""What ``analyze`` and ``diff`` are asked to do, checked once for every front end (the CLI, the MCP server):
outputs that would replace an input are refused, a regression threshold is a percentage, and the run
config is the ``--config`` file's values overridden by the values given one by one (with their sources).
Cheap to import: the heavy modules load only when a check needs them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from perfdoctor.config_values import value_problem, world_problem
from perfdoctor.errors import UsageError
from perfdoctor.outputs import check_outputs

# The run values a caller may give one by one (CLI flags, the MCP analyze tool's config).
CONFIG_KEYS = ("tp", "pp", "vpp", "cp", "dp", "ep", "num_microbatches")


def analysis_config(paths: list[Path], flags: dict[str, Any], config_file: Path | None, rules: list[Path],
                    outputs: dict[str, Path | None]) -> tuple[dict[str, Any], dict[str, str]]:
    """Check ``analyze``'s outputs against its inputs; the run config and where each value came from."""
    unknown = sorted(set(flags) - set(CONFIG_KEYS))
    if unknown:
        raise UsageError(f"unknown config value(s) {', '.join(unknown)} (known: {', '.join(CONFIG_KEYS)})")
    for key, value in flags.items():  # the CLI's click ranges, for front ends without click (the MCP server)
        if value is not None and (problem := value_problem(key, value)):
            raise UsageError(f"{key}: {problem}")
    if problem := world_problem({k: v for k, v in flags.items() if v is not None}):
        raise UsageError(problem)
    check_outputs(outputs, [*paths, *rules, *([config_file] if config_file else [])])
    from perfdoctor.load.config_file import user_config

    return user_config(config_file, flags)


def diff_config(base: Path, head: Path, config_file: Path | None, outputs: dict[str, Path | None],
                fail_on_regression: float | None) -> tuple[dict[str, Any], dict[str, str]]:
    """Check ``diff``'s threshold and outputs; the run config of both sides and its sources."""
    if fail_on_regression is not None and not (fail_on_regression >= 0 and math.isfinite(fail_on_regression)):
        raise UsageError(f"--fail-on-regression must be a finite percentage >= 0, not {fail_on_regression}")
    check_outputs(outputs, [base, head, *([config_file] if config_file else [])])
    from perfdoctor.load.config_file import user_config

    return user_config(config_file, {})
