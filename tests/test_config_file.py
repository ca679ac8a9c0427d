"""`--config FILE`: Megatron-LM arguments, a Megatron-Bridge ConfigContainer, a NeMo 2 recipe dump."""

from __future__ import annotations

import json

import pytest
import yaml

from perfdoctor.errors import InputError
from perfdoctor.load.config_file import MAX_BYTES, load_config_file, user_config
from tests.paths import REAL_H100
from tests.test_cli_bad_input import assert_one_line_error, run_cli

# Field names as the frameworks spell them (the project's research notes on Megatron, §4).
MEGATRON_LM_ARGS = {
    "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
    "data_parallel_size": 4, "micro_batch_size": 2, "global_batch_size": 64, "seq_length": 4096,
    "hidden_size": 4096, "num_layers": 32, "num_attention_heads": 32, "padded_vocab_size": 128256,
    "vocab_size": 128256, "overlap_grad_reduce": True, "ddp_bucket_size": 40000000, "swiglu": True,
    "rank": 0, "lr": 0.0003,
}
BRIDGE_CONTAINER = {
    "model": {"_target_": "megatron.bridge.models.llama.Llama3ModelProvider8B", "tensor_model_parallel_size": 4,
              "pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 4,
              "context_parallel_size": 2, "sequence_parallel": True, "num_layers": 32, "hidden_size": 4096,
              "seq_length": 8192, "cp_comm_type": "p2p"},
    "train": {"micro_batch_size": 1, "global_batch_size": 128, "manual_gc": True, "manual_gc_interval": 100},
    "ddp": {"overlap_grad_reduce": True, "bucket_size": 134217728, "grad_reduce_in_fp32": False},
    "mixed_precision": {"grad_reduce_in_fp32": False},
    "dataset": {"sequence_length": 8192},
}
NEMO_RECIPE = {
    "trainer": {"devices": 8, "num_nodes": 2, "strategy": {
        "tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
        "expert_model_parallel_size": 1, "ddp": {"overlap_grad_reduce": True}}},
    "model": {"config": {"num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "seq_length": 8192,
                         "enable_cuda_graph": False}},
    "data": {"micro_batch_size": 1, "global_batch_size": 512, "seq_length": 8192},
}


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return path


def test_megatron_lm_arguments(tmp_path):
    config = load_config_file(write(tmp_path, "args.json", MEGATRON_LM_ARGS))
    assert config["tp"] == 2 and config["dp"] == 4 and config["seq_length"] == 4096
    assert config["bucket_size"] == 40000000 and config["overlap_grad_reduce"] is True
    assert config["num_microbatches"] == 64 // (2 * 4)  # global / (micro × DP)
    assert "lr" not in config and "rank" not in config


def test_megatron_lm_flag_spellings(tmp_path):
    config = load_config_file(write(tmp_path, "args.yaml", {"--tensor-model-parallel-size": 8, "num-layers": 4}))
    assert config == {"tp": 8, "num_layers": 4}


def test_bridge_config_container(tmp_path):
    config = load_config_file(write(tmp_path, "config.yaml", BRIDGE_CONTAINER))
    assert (config["tp"], config["pp"], config["vpp"], config["cp"]) == (4, 2, 4, 2)
    assert config["micro_batch_size"] == 1 and config["manual_gc_interval"] == 100
    assert config["bucket_size"] == 134217728 and config["grad_reduce_in_fp32"] is False
    assert "num_microbatches" not in config  # DP is not in the file: not guessed


def test_nemo2_recipe_dump(tmp_path):
    config = load_config_file(write(tmp_path, "recipe.yaml", NEMO_RECIPE))
    assert (config["tp"], config["pp"], config["ep"]) == (8, 1, 1)
    assert config["num_layers"] == 80 and config["global_batch_size"] == 512
    assert config["enable_cuda_graph"] is False and config["overlap_grad_reduce"] is True


def test_flags_override_the_file(tmp_path):
    path = write(tmp_path, "config.yaml", BRIDGE_CONTAINER)
    config, sources = user_config(path, {"tp": 1, "pp": None})
    assert config["tp"] == 1 and sources["tp"] == "cli"
    assert config["pp"] == 2 and sources["pp"] == "config-file"


def test_report_carries_values_and_sources(capsys, tmp_path):
    path = write(tmp_path, "args.json", MEGATRON_LM_ARGS)
    code, out, err = run_cli(capsys, "analyze", str(REAL_H100), "--config", str(path), "--tp", "1",
                             "--format", "json")
    assert code == 0, err
    run = json.loads(out)["run"]
    assert run["config"]["tp"] == 1 and run["config_sources"]["tp"] == "cli"
    assert run["config"]["hidden_size"] == 4096 and run["config_sources"]["hidden_size"] == "config-file"
    assert run["config"]["num_layers"] == 32


@pytest.mark.parametrize(("text", "needle"), [
    ("tensor_model_parallel_size: [1, 2\n", "not valid YAML"),
    ("- 1\n- 2\n", "must be a mapping"),
    ("tensor_model_parallel_size: two\n", "tensor_model_parallel_size: expected a whole number from 1 to 1,048,576"),
    ("model: {pipeline_model_parallel_size: 0}\n",
     "model.pipeline_model_parallel_size: expected a whole number from 1"),
    ("!!python/object/apply:os.system ['echo pwned']\n", "not valid YAML"),
])
def test_bad_config_file_is_one_line(capsys, tmp_path, text, needle):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    code, _, err = run_cli(capsys, "analyze", str(REAL_H100), "--config", str(path))
    assert_one_line_error(code, err, needle)


def test_bad_json_and_missing_and_huge(capsys, tmp_path):
    (tmp_path / "args.json").write_text("{\"tensor_model_parallel_size\": ")
    code, _, err = run_cli(capsys, "diff", str(REAL_H100), str(REAL_H100), "--config", str(tmp_path / "args.json"))
    assert_one_line_error(code, err, "not valid JSON")
    code, _, err = run_cli(capsys, "analyze", str(REAL_H100), "--config", str(tmp_path / "nope.yaml"))
    assert_one_line_error(code, err, "no such file")
    big = tmp_path / "big.yaml"
    big.write_text("# pad\n" * (MAX_BYTES // 6 + 1))
    with pytest.raises(InputError, match="at most"):
        load_config_file(big)
