"""Every knob of every rule pastes: Megatron-Bridge and NeMo 2 lines parse as Python and name real config
fields, Megatron-LM flags are real flags with a value of their type, env lines are valid shell with the
type the consumer parses. Checked with the run's values known (computed literals) and unknown (typed
placeholders in comments)."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from functools import cache
from typing import Any

import pytest

from perfdoctor.diagnose import load_rules
from perfdoctor.diagnose.conditions import Context
from perfdoctor.diagnose.knob_values import COMPUTE, literal_problem, resolve_value
from perfdoctor.render.snippets import knob_snippets
from tests.paths import RESEARCH

# A run that tells every value a computation reads (a Llama-like 32-layer model on PP 4).
FULL = Context(
    metrics={"comm.dp.median_kernel_us": 120.0, "pipeline.bubble_ms": 40.0, "step.time_ms": 400.0},
    config={"tp": 4, "pp": 4, "cp": 2, "dp": 8, "ep": 8, "vpp": 1, "num_layers": 32, "num_microbatches": 8,
            "micro_batch_size": 1, "seq_length": 4096, "cpu_offloading_num_layers": 4, "bucket_size": 40_000_000},
    env={"LOCAL_WORLD_SIZE": "8", "NVTE_FWD_LAYERNORM_SM_MARGIN": "16"},
    evidence={"ln": {"blocker_ctas": 18}},
    device={"compute_capability": "9.0"},
)
EMPTY = Context(metrics={})


@cache
def _flags() -> dict[str, dict[str, Any]]:
    return {opt: f for f in json.loads((RESEARCH / "megatron_lm_flags.json").read_text()) for opt in f["opts"]}


@cache
def _research_text() -> str:
    """The identifiers of the research notes and the tuning guides (tests/data/research/config_vocabulary.txt,
    written by scripts/config_vocabulary.py) and the Megatron-LM argument names (dest), which the
    Megatron-Bridge / NeMo config fields mirror."""
    words = (RESEARCH / "config_vocabulary.txt").read_text().split()
    return "\n".join(words + sorted({f["dest"] for f in _flags().values()}))


def _knobs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for rule in load_rules():
        knobs = list(rule.spec["knobs"]) + list(rule.spec.get("next_step", {}).get("knobs", []))
        out += [(f"{rule.id}.{i}", k) for i, k in enumerate(knobs)]
    return out


KNOBS = _knobs()


def _resolved(knob: dict[str, Any], ctx: Context) -> dict[str, Any]:
    out = dict(knob)
    out["value"] = resolve_value(knob["value"], ctx)
    if "flag_value" in knob:
        out["flag_value"] = resolve_value(knob["flag_value"], ctx)
    return out


def _field_names_known(path: str) -> None:
    """Every attribute name of a config path appears in the research notes (the crosswalk of config fields)."""
    for name in path.split(".")[1:]:
        assert re.search(rf"\b{re.escape(name)}\b", _research_text()), f"{path}: {name!r} is not a known config field"


@pytest.mark.parametrize(("where", "knob"), KNOBS, ids=[w for w, _ in KNOBS])
@pytest.mark.parametrize("ctx", [FULL, EMPTY], ids=["run-tells", "run-silent"])
def test_every_knob_snippet_pastes(where, knob, ctx):
    resolved = _resolved(knob, ctx)
    assert literal_problem(resolved["value"], knob.get("type")) is None, where
    for snippet in knob_snippets(resolved):
        code = snippet.code
        if snippet.framework in ("megatron_bridge", "nemo"):
            ast.parse(code)
            if not code.startswith("#"):
                target = code.splitlines()[-1].split(" = ")[0]
                if snippet.framework == "megatron_bridge":
                    assert target.startswith("cfg."), code
                    _field_names_known(target)
                elif not target.startswith("executor.env_vars["):
                    assert target.startswith("recipe."), code
                    _field_names_known(target)
        elif snippet.framework == "megatron_lm":
            _check_flag(code, knob)
        else:
            _check_env(code, knob)


def _check_flag(code: str, knob: dict[str, Any]) -> None:
    if code.startswith("#"):
        assert re.fullmatch(r"# --[a-z0-9-]+ <(int|float|bool|str)>", code), code
        return
    flag, *rest = code.split(" ", 1)
    spec = _flags().get(flag)
    assert spec is not None, f"{flag} is not a Megatron-LM flag"
    if spec["action"] in ("_StoreTrueAction", "_StoreFalseAction"):
        assert not rest, f"{flag} is a switch, given {rest}"
        return
    assert rest, f"{flag} needs a value"
    value = rest[0]
    if spec["type"] == "<class 'int'>":
        int(value)
    elif spec["type"] == "<class 'float'>":
        float(value)
    if spec["choices"] not in ("None", None) and "AttnBackend" not in spec["choices"]:
        assert repr(value) in spec["choices"] or value in spec["choices"], (flag, value, spec["choices"])
    if "AttnBackend" in spec["choices"]:
        assert f"AttnBackend.{value}:" in spec["choices"], (flag, value)


def _check_env(code: str, knob: dict[str, Any]) -> None:
    bash = shutil.which("bash")
    assert bash
    assert subprocess.run([bash, "-n", "-c", code], capture_output=True).returncode == 0, code
    if code.startswith("#"):
        return
    match = re.fullmatch(r"export ([A-Z_][A-Z0-9_]*)=(\S+)", code)
    assert match, code
    name, value = match.groups()
    if name.startswith(("NVTE_", "CUDA_", "NCCL_NVLS", "NCCL_MAX", "TORCH_NCCL")) or knob.get("type") == "int":
        int(value)  # Transformer Engine, CUDA and NCCL parse these as integers


def test_no_value_is_prose():
    for where, knob in KNOBS:
        for key in ("value", "flag_value"):
            if key in knob and not isinstance(knob[key], dict):
                assert literal_problem(knob[key], knob.get("type") if key == "value" else None) is None, where


def test_prose_value_is_rejected_with_file_and_field(tmp_path):
    from perfdoctor.diagnose import RuleError
    from tests.diagnose.test_rule_engine import GOOD, _write

    spec = {**GOOD, "knobs": [{"megatron_bridge": "train.micro_batch_size", "nemo": None, "megatron_lm": None,
                               "env": None, "value": "larger, if memory allows", "type": "int"}]}
    path = _write(tmp_path, spec, "slow-steps")
    with pytest.raises(RuleError, match=r"knobs\.0\.value: value 'larger, if memory allows' is prose"):
        load_rules([tmp_path])
    spec["knobs"][0]["value"] = {"compute": "no_such_thing"}
    _write(tmp_path, spec, "slow-steps")
    with pytest.raises(RuleError, match=r"knobs\.0\.value\.compute: unknown computation"):
        load_rules([tmp_path])
    assert path.exists()


def test_vpp_value_divides_the_layers_per_stage_and_the_flag_takes_layers():
    knob = next(k for w, k in KNOBS if w.startswith("pipeline-bubble") and k["megatron_lm"] ==
                "--num-layers-per-virtual-pipeline-stage")
    codes = {s.framework: s.code for s in knob_snippets(_resolved(knob, FULL))}
    # 32 layers on PP 4: 8 per stage; VPP 2 gives 4 layers per virtual stage.
    assert codes["megatron_bridge"] == "cfg.model.virtual_pipeline_model_parallel_size = 2"
    assert codes["megatron_lm"] == "--num-layers-per-virtual-pipeline-stage 4"
    odd = Context(metrics={}, config={"num_layers": 36, "pp": 4})  # 9 per stage: VPP 3, 3 layers each
    assert COMPUTE["vpp_size"](odd) == 3 and COMPUTE["layers_per_virtual_stage"](odd) == 3
    prime = Context(metrics={}, config={"num_layers": 28, "pp": 4})  # 7 per stage: only VPP 7 divides it
    assert COMPUTE["vpp_size"](prime) == 7 and COMPUTE["layers_per_virtual_stage"](prime) == 1
    assert COMPUTE["vpp_size"](Context(metrics={}, config={"pp": 4})) is None  # layers unknown: placeholder


def test_computed_values_follow_the_run():
    assert COMPUTE["dp_bucket_size"](FULL) == 40_000_000 * 3  # 120 us median: 3x the bytes per collective
    assert COMPUTE["ln_sm_margin"](FULL) == 20  # 18 NCCL CTAs, rounded up to a multiple of 4
    assert COMPUTE["max_connections"](FULL) == 1
    assert COMPUTE["max_connections"](Context(metrics={}, device={"compute_capability": "10.0"})) is None
    assert COMPUTE["gpus_per_node"](FULL) == 8
    placeholder = {s.framework: s.code for s in knob_snippets(
        {"megatron_lm": "--micro-batch-size", "megatron_bridge": "train.micro_batch_size", "env": None,
         "nemo": "recipe.data.micro_batch_size", "value": None, "type": "int"})}
    assert placeholder == {"megatron_bridge": "# cfg.train.micro_batch_size = <int>",
                           "nemo": "# recipe.data.micro_batch_size = <int>",
                           "megatron_lm": "# --micro-batch-size <int>"}


def test_env_knob_for_nemo_is_an_item_of_env_vars_not_the_dict():
    knob = {"megatron_bridge": None, "nemo": "executor.env_vars", "megatron_lm": None,
            "env": "NCCL_NET_GDR_LEVEL", "value": "PHB", "type": "str"}
    codes = {s.framework: s.code for s in knob_snippets(knob)}
    assert codes["nemo"] == "executor.env_vars['NCCL_NET_GDR_LEVEL'] = 'PHB'"
    assert codes["env"] == "export NCCL_NET_GDR_LEVEL=PHB"


def test_explain_examples_paste():
    """The worked examples of `perfdoctor explain` are snippets too: Python parses, flags exist, shell is valid."""
    for rule in load_rules():
        fix = rule.spec["explain"]["fix"]
        for key in ("megatron_bridge", "nemo"):
            if key in fix:
                tree = ast.parse(fix[key])
                assert not any(isinstance(n, ast.Constant) and n.value is Ellipsis for n in ast.walk(tree)), rule.id
        if "megatron_lm" in fix and not fix["megatron_lm"].lstrip().startswith("export"):
            for flag in re.findall(r"(?<![\w-])--[a-z0-9-]+", fix["megatron_lm"].split("#")[0]):
                assert flag in _flags(), f"{rule.id}: {flag}"
        for key, prefix in (("env", ""), ("megatron_lm", "python pretrain_gpt.py ")):
            if key in fix:
                script = fix[key] if fix[key].lstrip().startswith("export") else prefix + fix[key]
                assert subprocess.run(["bash", "-n", "-c", script], capture_output=True).returncode == 0, rule.id
