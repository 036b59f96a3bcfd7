"""vLLM's engine profiles live beside the backend (roll_device/compat/vllm.py): one per built-in
kind, none for a kind vLLM does not serve, and one hook a plugin kind fills."""

import pytest

import roll_device as rd
from roll_device.compat import vllm as profiles
from roll_device.compat.vllm import VLLM_FOR_CPU, EngineProfile, profile_for, register
from roll_device.errors import ConfigError
from roll_device.platforms.cpu import CpuPlatform
from strategies.inference.vllm import VllmStrategy


class PluginPlatform(CpuPlatform):
    """A plugin kind (named only in this test) that vLLM serves through its vendor's plugin."""

    kind = "plugin-accel"


def test_each_built_in_kind_has_its_profile():
    npu = profile_for(rd.get_platform("npu"))
    assert npu.env == {"VLLM_ASCEND_ENABLE_NZ": "0"} and npu.sleep_levels == (1,) and npu.derive_capture_sizes
    assert [p.distribution for p in npu.packages] == ["vllm", "vllm-ascend"]
    cpu = profile_for(rd.get_platform("cpu"))
    assert cpu.in_process and not cpu.graphs and cpu.sleep_level is None
    assert profile_for(rd.get_platform("cuda")).default_graph_mode == "FULL_AND_PIECEWISE"
    assert profile_for(rd.get_platform("rocm")) == profile_for(rd.get_platform("cuda"))


def test_a_plugin_kind_is_served_once_it_registers(monkeypatch):
    monkeypatch.setattr(profiles, "PROFILES", dict(profiles.PROFILES))
    plugin = PluginPlatform()
    assert profile_for(plugin) is None and not VllmStrategy.serves(plugin)
    mine = EngineProfile(packages=(VLLM_FOR_CPU,), in_process=True, sleep_levels=())
    register("plugin-accel", mine)
    register("plugin-accel", mine)  # the same profile again (a module imported twice) is fine
    assert profile_for(plugin) is mine and VllmStrategy.serves(plugin)
    with pytest.raises(ConfigError, match="already has an engine profile for device kind 'plugin-accel'"):
        register("plugin-accel", EngineProfile(packages=(VLLM_FOR_CPU,)))
