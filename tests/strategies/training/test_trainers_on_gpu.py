"""FSDP2 and Megatron-core (TP=1) on a real GPU, one rank over the platform's backend: logprobs
equal to transformers, steps equal to plain AdamW steps of transformers on the CPU, bf16 compute by default, offload and reload
seen in `mem_get_info`. Needs a CUDA or ROCm GPU; skipped cleanly without one (CI has none)."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from tests.isolated import run_isolated

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]
TRAINERS = [
    "fsdp",
    pytest.param(
        "megatron",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed"
        ),
    ),
]
CHECKS = "tests.strategies.training.gpu_checks"


@pytest.fixture(scope="module")
def shaped_model_path(tmp_path_factory):
    from roll_device.models.qwen_shaped import make_qwen_shaped_model

    return str(make_qwen_shaped_model(tmp_path_factory.mktemp("models") / "qwen-shaped-4", num_layers=4))


@pytest.mark.parametrize("name", TRAINERS)
def test_fp32_step_equals_transformers_and_bf16_is_the_default(name, tiny_model_path):
    out = run_isolated(f"{CHECKS}:exactness", name, tiny_model_path)
    assert out["platform"] in ("cuda", "rocm") and out["param_device"] == "cuda:0"
    assert out["backend"] == "nccl"
    assert out["logprob_diff"] < 1e-4
    assert out["grad_norm"] == pytest.approx(out["reference_grad_norm"], rel=1e-4)
    assert out["weight_diff_vs_reference"] < 1e-3  # Adam's first update is lr-sized: 5e-3
    assert out["fp32_losses"] == pytest.approx(out["reference_losses"], rel=1e-4)
    assert out["default_compute_dtypes"] == ["torch.bfloat16"]
    assert out["default_master_dtypes"] == ["torch.float32"]
    assert out["default_losses"] == pytest.approx(out["reference_losses"], rel=5e-2)  # bf16 rounding
    assert out["group_released"]


@pytest.mark.parametrize("name", TRAINERS)
def test_offload_frees_device_memory_and_reload_restores_it(name, shaped_model_path):
    out = run_isolated(f"{CHECKS}:memory", name, shaped_model_path)
    free, reserved, allocated = out["free_mib"], out["reserved_mib"], out["allocated_mib"]
    state = out["state_mib"]
    # fp32 master weights (0.8 GB) and Adam's two moments of a 200M-parameter model
    assert state["trained"] > 2000 and state["offloaded"] == 0 and state["reloaded"] == state["trained"]
    assert out["others_moved_mib"] <= 16  # no other process moved the device's free memory meanwhile
    # offload gives the device memory back, itself: not left in the caching allocator (the
    # 0.5B-shaped job on an H100 freed 7.4 GiB into the cache and gave the GPU none of it)
    assert out["offload_gave_back_mib"] > 0.9 * state["trained"]
    assert free["offloaded"] - free["trained"] > 0.9 * state["trained"]
    # reload takes it again: the state, less the room the allocator's kept segments already had
    # (an H100 run: 2240 MiB of state took only 1808 MiB more of the device)
    room = reserved["offloaded"] - allocated["offloaded"]
    assert allocated["reloaded"] - allocated["offloaded"] >= state["trained"] - 1  # MiB rounding
    assert free["offloaded"] - free["reloaded"] > 0.9 * state["trained"] - room
    assert out["logprobs_equal_after_reload"]
    assert math.isfinite(out["loss_after_reload"])


def test_fsdp_reference_beside_the_policy(tiny_model_path):
    """The pipeline's hosted reference on the GPU: a second FSDP trainer in the process, over the
    same NCCL group, stays frozen while the policy steps."""
    out = run_isolated(f"{CHECKS}:hosted_reference", "fsdp", tiny_model_path)
    assert out["backend"] == "nccl"
    assert out["start_diff"] < 1e-5
    assert out["reference_moved"] == 0.0 and out["policy_moved"] > 1e-3
