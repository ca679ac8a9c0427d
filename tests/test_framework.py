"""run.framework (DESIGN §5): recognised from the manifest, the capture hook's Megatron marks, NVTX and
kernel names, and the environment; unknown when nothing in the trace says PyTorch or Megatron."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfdoctor.classify.framework import detect_framework
from perfdoctor.load.run import load_run
from perfdoctor.model import Run, TraceInfo
from tests.paths import REAL_H100, SAMPLES, TRACES


def _run(folder: Path, env: dict[str, str] | None = None, **config_sources: str) -> Run:
    info = TraceInfo(path=folder / "rank0.sqlite", format="nsys-sqlite", product_version=None, schema_version=None,
                     meta_table="META_DATA_EXPORT", session_start_utc_ns=None, has_cuda=True, env=env or {})
    return Run(traces=[info], timelines=[], config_sources=dict(config_sources))


@pytest.mark.parametrize(("manifest", "name"), [
    ({"versions": {"megatron-bridge": "0.2", "megatron-core": "0.14"}}, "megatron-bridge"),
    ({"versions": {"nemo_toolkit": "2.4", "megatron_core": "0.13"}}, "nemo2"),
    ({"versions": {"megatron-core": "0.14"}, "command": ["torchrun", "pretrain_gpt.py"]}, "megatron-lm"),
    ({"versions": {"megatron-core": "0.14"}, "command": ["torchrun", "train.py"]}, "megatron-core"),
])
def test_manifest_names_the_framework(tmp_path, manifest, name):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    found = detect_framework(_run(tmp_path))
    assert found["name"] == name and "manifest" in found["source"]


def test_hook_marks_environment_and_nothing(tmp_path):
    assert detect_framework(_run(tmp_path, tp="nvtx-mark"))["name"] == "megatron-core"
    assert detect_framework(_run(tmp_path, tp="cli"))["name"] == "unknown"  # a CLI option is not evidence
    assert detect_framework(_run(tmp_path, {"NEMO_LAUNCHER": "1"}))["name"] == "nemo2"
    assert detect_framework(_run(tmp_path, {"TORCHELASTIC_RUN_ID": "x"}))["name"] == "pytorch"
    (tmp_path / "manifest.json").write_text("{not json")  # unreadable manifest: ignored, not an error
    assert detect_framework(_run(tmp_path, {"SLURM_PROCID": "0"}))["name"] == "unknown"


@pytest.mark.parametrize(("path", "name"), [
    (SAMPLES / "exposed_dp", "megatron-core"),
    (SAMPLES / "unlabeled", "pytorch"),
    (REAL_H100, "pytorch"),
    (TRACES / "nsys" / "pipit_cloverleaf.sqlite", "unknown"),
])
def test_traces(path, name):
    if not path.exists():
        pytest.skip(f"{path} not present")
    assert detect_framework(load_run([path], None))["name"] == name
