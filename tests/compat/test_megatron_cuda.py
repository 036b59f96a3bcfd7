"""The scoped redirect of megatron-core's hard-coded CUDA calls to the CPU platform."""

from __future__ import annotations

import contextlib

import pytest
import torch

import roll_device as rd
from roll_device.compat import megatron as megatron_compat
from roll_device.compat.megatron_cuda import is_active, redirect_cuda
from roll_device.errors import ConfigError
from strategies.training.megatron import MegatronTrainStrategy
from tests.isolated import run_isolated

CPU = rd.get_platform("cpu")


def test_inside_the_scope_cuda_calls_land_on_the_platform():
    from megatron.core.tensor_parallel import random as megatron_random

    with redirect_cuda(CPU):
        assert torch.cuda.current_device() == 0
        made = [
            torch.zeros([], device="cuda"),
            torch.tensor([1.0], device="cuda:0"),
            torch.empty(2, device=0),
        ]
        made.append(torch.ones(2).cuda())
        assert {t.device.type for t in made} == {"cpu"}
        assert torch.ones(2).type() == "torch.cuda.FloatTensor"
        assert torch.ones(2, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
        assert torch.equal(torch.cuda.get_rng_state(), torch.get_rng_state())
        tracker = megatron_random.CudaRNGStatesTracker()
        tracker.add("stream", 1234)
        torch.manual_seed(0)
        with tracker.fork("stream"):
            forked = torch.rand(3)
        torch.manual_seed(1234)
        assert torch.equal(forked, torch.rand(3))  # the fork drew from the seeded stream


def test_outside_the_scope_nothing_is_redirected():
    original = torch.cuda.current_device
    with redirect_cuda(CPU):
        assert torch.cuda.current_device is not original
    assert torch.cuda.current_device is original and not is_active()
    assert torch.ones(2).type() == "torch.FloatTensor"
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")


def test_scopes_nest_and_the_outermost_restores():
    original = torch.cuda.current_device
    with redirect_cuda(CPU):
        with redirect_cuda(CPU):
            pass
        assert is_active() and torch.cuda.current_device() == 0
    assert torch.cuda.current_device is original


@pytest.mark.slow  # the negative control; every Megatron test of the default run passes through the redirect
def test_megatron_without_the_redirect_fails_on_cpu(tiny_model_path):
    """The redirect carries weight: the same trainer with it removed stops on a CUDA call."""
    out = run_isolated("tests.compat.megatron_cuda_checks:without_redirect", tiny_model_path)
    assert "Torch not compiled with CUDA enabled" in out["error"]


def test_adapters_by_kind():
    assert megatron_compat.prepare(rd.get_platform("cuda"), {}) is contextlib.nullcontext
    assert megatron_compat.kinds() == ("cpu", "npu", "cuda", "rocm")

    class Other(type(CPU)):
        kind = "tpu"

    with pytest.raises(ConfigError, match="no adapter for device kind 'tpu'"):
        megatron_compat.prepare(Other(), {})


def test_a_simulated_npu_runs_megatron_core_through_the_redirects():
    """A simulation computes with the host's kernels: the CPU's adapter, to the simulated platform
    (MindSpeed is not installed here: applying it would fail)."""

    class SimulatedNpu(type(CPU)):
        kind = "npu"

    platform = SimulatedNpu(simulated=True)
    assert (platform.kernels_kind, SimulatedNpu().kernels_kind) == ("cpu", "npu")
    with megatron_compat.prepare(platform, {})():
        assert is_active()
    assert not is_active()
    assert MegatronTrainStrategy.requirements("npu-sim").packages == (megatron_compat.MEGATRON_CORE,)
    assert "mindspeed" in {p.module for p in MegatronTrainStrategy.requirements("npu").packages}


def test_a_plugin_kind_registers_its_adapter(monkeypatch):
    monkeypatch.setattr(megatron_compat, "ADAPTERS", dict(megatron_compat.ADAPTERS))
    monkeypatch.setattr(megatron_compat, "PACKAGES", dict(megatron_compat.PACKAGES))

    class Plugin(type(CPU)):
        kind = "plugin-accel"

    assert not MegatronTrainStrategy.serves(Plugin())
    megatron_compat.register("plugin-accel")
    assert (
        MegatronTrainStrategy.serves(Plugin())
        and megatron_compat.prepare(Plugin(), {}) is contextlib.nullcontext
    )
    assert megatron_compat.packages("plugin-accel") == (megatron_compat.MEGATRON_CORE,)
    with pytest.raises(ConfigError, match="already has an adapter for device kind 'plugin-accel'"):
        megatron_compat.register("plugin-accel", lambda platform, options: contextlib.nullcontext)
