"""vLLM-Ascend's facts in the NPU engine profile (roll_device/compat/vllm_ascend.py): additional_config
keys checked against what the pinned release accepts (one line naming the key and the accepted
ones), and the graph modes known good with in-place weight updates per model type."""

import logging

import pytest

import roll_device as rd
from roll_device.compat.vllm import VLLM_FOR_DEVICES, EngineProfile, profile_for
from roll_device.compat.vllm_ascend import (
    ADDITIONAL_CONFIG_KEYS,
    RL_CONFIG_KEYS,
    check_additional_config,
    known_good_modes,
)
from roll_device.errors import ConfigError
from strategies.inference.vllm_args import build_engine_spec, graph_mode_unproven
from tests.configs import rollout_settings


def test_the_npu_profile_passes_its_own_check():
    npu = profile_for(rd.get_platform("npu"))
    check_additional_config(npu.args["additional_config"])
    assert npu.graph_safe_modes is known_good_modes and not npu.recapture_graphs


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"rl_config": {"enabled": True, "nz_off": True}},
            "additional_config.rl_config.nz_off is not a vLLM-Ascend rl_config key: one of "
            + ", ".join(RL_CONFIG_KEYS),
        ),
        (
            {"torchair_graph_config": {"enabled": True}},
            (
                "additional_config.torchair_graph_config was removed from vLLM-Ascend (torchair was removed for "
                "npugraph_ex: use ascend_compilation_config)"
            ),
        ),
        (
            {"ascend_scheduler_config": {}},
            (
                "additional_config.ascend_scheduler_config was removed from vLLM-Ascend (the Ascend scheduler was "
                "removed: use vLLM's scheduler (scheduler_config))"
            ),
        ),
        (
            {"rl_mode": True},
            "additional_config.rl_mode is not a vLLM-Ascend additional_config key: one of "
            + ", ".join(sorted(ADDITIONAL_CONFIG_KEYS)),
        ),
        (
            {"rl_config": True},
            "additional_config.rl_config must be a mapping of " + ", ".join(RL_CONFIG_KEYS),
        ),
    ],
)
def test_an_unknown_key_is_one_line_naming_it(config, message):
    with pytest.raises(ConfigError) as raised:
        check_additional_config(config)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_a_profile_with_an_unknown_key_is_refused_when_made():
    with pytest.raises(ConfigError, match=r"^additional_config\.rl_config\.enable is not"):
        EngineProfile(
            packages=(VLLM_FOR_DEVICES,),
            args={"additional_config": {"rl_config": {"enable": True}}},
            additional_config_check=check_additional_config,
        )


def test_known_good_modes_per_model_type():
    assert known_good_modes("qwen2") == ("NONE", "FULL_DECODE_ONLY")
    assert known_good_modes("deepseek_v3") == ("NONE", "FULL_DECODE_ONLY")
    assert known_good_modes("deepseek_v4") == ("NONE",)  # its fix (#15666) is newer than the pin
    assert known_good_modes(None) == ("NONE",)


def _model(tmp_path, model_type):
    (tmp_path / "config.json").write_text(f'{{"model_type": "{model_type}", "num_hidden_layers": 2}}')
    return str(tmp_path)


def test_an_unproven_graph_mode_is_said_when_the_engine_is_built(tmp_path, caplog):
    npu, settings = rd.get_platform("npu"), rollout_settings("vllm")
    engine = profile_for(npu)
    assert graph_mode_unproven(engine, "FULL_DECODE_ONLY", _model(tmp_path, "qwen2")) is None
    caplog.set_level(logging.WARNING, logger="strategies.inference.vllm_args")
    build_engine_spec(npu, _model(tmp_path, "mixtral"), settings, environ={})
    assert [r.getMessage() for r in caplog.records] == [
        (
            "graph_mode=FULL_DECODE_ONLY is not known good with in-place weight updates for model type 'mixtral' "
            "(known good: NONE; roll_device/compat/vllm_ascend.py): the graph guard checks the graphs after every "
            "weight sync"
        )
    ]
    assert (
        graph_mode_unproven(profile_for(rd.get_platform("cuda")), "FULL", _model(tmp_path, "mixtral")) is None
    )
