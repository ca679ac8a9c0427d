"""Where nsys goes in torchrun / python / srun launches, and the profile command per nsys release."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfdoctor.capture.command import parse_launch, report_pattern, wrap
from perfdoctor.capture.nsys_cli import NsysCli, export_args, parse_options, parse_profile_help, profile_args
from perfdoctor.errors import UsageError
from tests.paths import REPO

NSYS = ["nsys", "profile", "--output=RUN/x"]
HELP = REPO / "tests" / "data" / "nsys_profile_help"


def test_torchrun_per_node_wraps_the_launcher() -> None:
    launch = parse_launch(["torchrun", "--nproc_per_node", "2", "--standalone", "train.py", "--lr", "1"])
    assert launch.torchrun == ["torchrun", "--nproc_per_node", "2", "--standalone"]
    assert launch.program == ["train.py", "--lr", "1"]
    assert wrap(launch, NSYS, per_rank=False, ranks=None) == [*NSYS, "torchrun", "--nproc_per_node", "2",
                                                                "--standalone", "train.py", "--lr", "1"]
    assert report_pattern(launch, per_rank=False) == "node-%h"


def test_torchrun_per_rank_puts_nsys_between_torchrun_and_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHON_EXEC", "/opt/py/bin/python3")
    launch = parse_launch(["torchrun", "--nproc-per-node=8", "-m", "pkg.train", "--x"])
    assert wrap(launch, NSYS, per_rank=True, ranks=None) == [
        "torchrun", "--nproc-per-node=8", "--no-python", *NSYS, "/opt/py/bin/python3", "-m", "pkg.train", "--x"]
    assert report_pattern(launch, per_rank=True) == "rank%q{RANK}"
    module_form = parse_launch(["python3", "-m", "torch.distributed.run", "--nnodes", "1", "train.py"])
    assert module_form.torchrun == ["python3", "-m", "torch.distributed.run", "--nnodes", "1"]
    assert wrap(module_form, NSYS, per_rank=True, ranks=None)[:6] == [
        "python3", "-m", "torch.distributed.run", "--nnodes", "1", "--no-python"]


def test_selected_ranks_get_nsys_through_a_shell_case() -> None:
    launch = parse_launch(["torchrun", "--no-python", "./train.sh"])
    argv = wrap(launch, NSYS, per_rank=True, ranks=[0, 3])
    assert argv[:4] == ["torchrun", "--no-python", "/bin/sh", "-c"]
    assert 'case "${RANK}" in 0|3) exec nsys profile --output=RUN/x "$@";; *) exec "$@";; esac' == argv[4]
    assert argv[5:] == ["perfdoctor-rank", "./train.sh"]


def test_srun_tasks_are_ranks() -> None:
    launch = parse_launch(["srun", "-N", "2", "--ntasks-per-node=8", "-l", "python", "train.py"])
    assert launch.srun == ["srun", "-N", "2", "--ntasks-per-node=8", "-l"] and launch.per_rank_default
    assert wrap(launch, NSYS, per_rank=True, ranks=None) == [*launch.srun, *NSYS, "python", "train.py"]
    assert report_pattern(launch, per_rank=True) == "rank%q{SLURM_PROCID}"
    with pytest.raises(UsageError, match="--per-node needs"):
        wrap(launch, NSYS, per_rank=False, ranks=None)
    nested = parse_launch(["srun", "--ntasks-per-node", "1", "torchrun", "--nproc_per_node", "8", "train.py"])
    assert not nested.per_rank_default
    assert wrap(nested, NSYS, per_rank=False, ranks=None) == ["srun", "--ntasks-per-node", "1", *NSYS, "torchrun",
                                                              "--nproc_per_node", "8", "train.py"]


def test_launchers_without_a_program_are_usage_errors() -> None:
    for argv in ([], ["torchrun", "--nproc_per_node", "2"], ["srun", "-N", "2"]):
        with pytest.raises(UsageError):
            parse_launch(argv)


@pytest.mark.parametrize("release", ["2022.4", "2023.4", "2024.2"])
def test_profile_command_follows_the_release_help(release: str) -> None:
    options, traces = parse_profile_help((HELP / f"profile_help_{release}.txt").read_text())
    assert {"--cpuctxsw", "--capture-range", "--capture-range-end", "--trace", "--sample"} <= options
    assert {"cuda", "nvtx", "osrt", "cublas", "cudnn"} <= traces
    assert ("python-gil" in traces) == (release != "2022.4")
    cli = NsysCli("nsys", f"{release}.1", options, traces)
    gpu = profile_args(cli, output="R/node-%h", cuda=True, profiler_api=True, force=False)
    assert "--trace=cuda,nvtx,osrt,cublas,cudnn" in gpu and "--cpuctxsw=none" in gpu and "--sample=none" in gpu
    assert "--capture-range=cudaProfilerApi" in gpu and "--capture-range-end=stop" in gpu
    assert gpu[-2:] == ["--force-overwrite=false", "--output=R/node-%h"]
    cpu = profile_args(cli, output="R/x", cuda=False, profiler_api=False, force=True, extra=["--stats=false"])
    assert "--trace=nvtx,osrt" in cpu and not any(a.startswith("--capture-range") for a in cpu)
    assert cpu[-1] == "--stats=false" and "--force-overwrite=true" in cpu


def test_export_keeps_nvtx_payload_blobs_where_the_release_can() -> None:
    """2026.x exports NCCL's NVTX payloads (communicator ids) only with --include-blobs=true."""
    old = parse_options((HELP / "export_help_2022.4.txt").read_text())
    assert {"--type", "--output", "--force-overwrite"} <= old and "--include-blobs" not in old
    args = export_args(NsysCli("nsys", "2022.4.2.1", export_options=old), Path("r.nsys-rep"), Path("r.sqlite"),
                       force=True)
    assert not any(a.startswith("--include-blobs") for a in args) and args[-1] == "r.nsys-rep"
    new = NsysCli("nsys", "2026.2.1", export_options=old | {"--include-blobs"})
    assert "--include-blobs=true" in export_args(new, Path("r.nsys-rep"), Path("r.sqlite"), force=True)
