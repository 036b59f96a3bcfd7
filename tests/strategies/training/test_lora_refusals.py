"""What LoRA refuses before Ray starts, in one line (the engine's adapters on a mixture of experts
once the model is on disk), and what a LoRA run plans: no reference worker (the reference is the
policy's base)."""

from __future__ import annotations

import pytest

from roll_device.cluster import Inventory, NodeInfo
from roll_device.compat.vllm import PROFILES
from roll_device.pipeline.run_plan import build_run_plan, check_expert_adapters
from roll_device.platforms import get_platform
from strategies.inference.hf import HfStrategy
from strategies.training.fsdp import FsdpTrainStrategy
from tests.configs import run_config, trainer_settings
from tests.refusals import one_line_refusal

HOST = Inventory((NodeInfo("h" * 56, "10.0.0.1", "head", cpus=4, is_head=True),))


@pytest.mark.parametrize("rank", [0, -4])
def test_a_rank_below_one_is_refused(rank):
    message = one_line_refusal(lambda: run_config(f"trainer.lora.rank={rank}"))
    assert message.startswith(f"trainer.lora.rank={rank}: input should be greater than or equal to 1")


def test_unknown_target_modules_are_refused_with_the_models_linear_layers(tiny_model_path):
    settings = trainer_settings(
        "fsdp", lora={"rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["qkv"]}
    )
    message = one_line_refusal(lambda: FsdpTrainStrategy.check_model(None, settings, tiny_model_path))
    assert message == (
        "trainer.lora.target_modules=['qkv']: the model has no linear layer named qkv; its linear layers "
        "are down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj (or use all-linear)"
    )
    known = trainer_settings(
        "fsdp", lora={"rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj"]}
    )
    FsdpTrainStrategy.check_model(None, known, tiny_model_path)


def test_target_modules_take_all_linear_or_a_list():
    message = one_line_refusal(
        lambda: run_config("trainer.lora.rank=8", "trainer.lora.target_modules=q_proj")
    )
    assert message.startswith("trainer.lora.target_modules='q_proj': give all-linear or a list")


def test_megatron_refuses_lora_with_the_reason():
    message = one_line_refusal(lambda: run_config("trainer=megatron", "trainer.lora.rank=8"))
    assert message.startswith("trainer.lora.rank=8: megatron-core 0.16 has no LoRA adapters")


def test_an_engine_that_cannot_serve_adapters_is_refused_when_planned(monkeypatch):
    monkeypatch.setattr(HfStrategy, "serves_adapters", classmethod(lambda cls, kind: False))
    message = one_line_refusal(lambda: build_run_plan(run_config("rollout=hf", "trainer.lora.rank=8"), HOST))
    assert message == (
        "trainer.lora.rank=8: the hf rollout engine cannot serve LoRA adapters on cpu: use rollout=vllm "
        "or rollout=hf, or trainer.lora.rank=null"
    )


def test_vllm_refuses_a_rank_above_its_largest():
    message = one_line_refusal(lambda: build_run_plan(run_config("trainer.lora.rank=1024"), HOST))
    assert message == "trainer.lora.rank=1024: vLLM serves LoRA ranks up to 512: lower it"


def test_a_lora_run_takes_its_reference_from_the_base_and_starts_no_reference_worker():
    config = run_config("trainer.lora.rank=8")
    assert config.reference_from_base
    plan = build_run_plan(config, HOST)
    assert "reference" not in plan.roles and not plan.hosted
    assert not run_config("trainer.lora.rank=8", "algorithm.kl_coef=0").reference_from_base
    assert "reference" in build_run_plan(run_config(), HOST).roles


def test_an_engine_that_drops_its_weights_at_sleep_is_refused_with_lora():
    config = run_config("rollout=hf", "rollout.sleep_level=2", "trainer.lora.rank=8")
    message = one_line_refusal(lambda: build_run_plan(config, HOST))
    assert message == (
        "rollout.sleep_level=2 drops the engine's weights at each sleep, but with trainer.lora.rank=8 a "
        "sync sends the adapters only: set rollout.sleep_level to 1 or null"
    )


def test_vllm_on_the_cpu_refuses_adapters_on_a_mixture_of_experts_and_the_hf_engine_serves_them(
    tiny_moe_path, tiny_model_path
):
    cpu = get_platform("cpu")
    message = one_line_refusal(
        lambda: check_expert_adapters(run_config("trainer.lora.rank=8"), cpu, tiny_moe_path)
    )
    assert message == (
        f"trainer.lora.rank=8 on a mixture of experts (model.path={tiny_moe_path}): the vllm rollout engine "
        f"cannot serve its adapters on cpu ({PROFILES['cpu'].lacks_expert_adapters}): use rollout=hf, or "
        "trainer.lora.rank=null"
    )
    check_expert_adapters(run_config("trainer.lora.rank=8", "rollout=hf"), cpu, tiny_moe_path)
    check_expert_adapters(run_config("trainer.lora.rank=8"), cpu, tiny_model_path)  # a dense model
    check_expert_adapters(run_config("trainer.lora.rank=8"), None, tiny_moe_path)  # kind not known yet
