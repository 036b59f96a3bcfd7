"""PPO's critic on megatron-core (strategies/training/megatron_critic.py) on the CPU: in one
process against the FSDP critic (dense and a mixture of experts), from a causal LM and from a
critic's checkpoint, through a checkpoint round trip; on two gloo ranks of one model replica
against transformers' critic model; on a GPU (gpu-marked), against the FSDP critic there."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from strategies.registry import strategy_class
from strategies.training.local_ranks import run_ranks
from strategies.training.megatron_critic import MegatronCriticStrategy
from tests.isolated import run_isolated
from tests.strategies.training.megatron_critic_checks import make_critic_checkpoint

CHECKS = "tests.strategies.training.megatron_critic_checks"


@pytest.fixture(scope="module")
def critic_path(tiny_model_path, tmp_path_factory):
    return make_critic_checkpoint(tiny_model_path, str(tmp_path_factory.mktemp("critic-model")))


@pytest.fixture(scope="module")
def single_process(tiny_model_path, critic_path, tiny_moe_path, tmp_path_factory):
    checkpoint = str(tmp_path_factory.mktemp("megatron-critic-checkpoint"))
    return run_isolated(
        f"{CHECKS}:single_process",
        tiny_model_path,
        critic_path,
        tiny_moe_path,
        checkpoint,
    )


def test_registered_for_the_kinds_the_megatron_trainer_serves():
    for kind in ("cuda", "rocm", "npu", "cpu"):
        assert strategy_class("critic", "megatron", kind) is MegatronCriticStrategy


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_values_and_value_steps_equal_the_fsdp_critics(single_process, model):
    """The dense model from a critic's checkpoint (its own head); the mixture of experts from the
    causal LM (a zero head), with the policy's load-balancing coefficient, which neither critic applies."""
    run = single_process[model]
    assert run["first_values_diff"] < 1e-5
    for fsdp, megatron in zip(run["fsdp_steps"], run["megatron_steps"], strict=True):
        assert megatron["loss"] == pytest.approx(fsdp["loss"], rel=1e-5)
        assert megatron["grad_norm"] == pytest.approx(fsdp["grad_norm"], rel=1e-5)
        assert set(megatron) == set(fsdp), "the same metrics: no routing metrics from a critic"
    assert run["megatron_steps"][-1]["loss"] < run["megatron_steps"][0]["loss"]
    assert run["values_diff_after"] < 1e-5


def test_a_critic_from_a_causal_lm_starts_with_a_zero_head_and_exports_it(single_process):
    assert single_process["zero_head_values"] == 0.0
    assert sorted(single_process["exported_head"]) == ["score.bias", "score.weight"]


def test_the_checkpoint_round_trip_gives_the_same_next_step(single_process):
    assert single_process["after_load"] == pytest.approx(single_process["after_save"], rel=1e-6)


def test_a_critic_update_that_is_not_finite_is_refused_in_its_own_words(single_process):
    assert single_process["refused"].startswith(
        "NonFiniteUpdateError: the critic's value update was not applied: its loss is nan"
    )


@pytest.mark.parametrize("layout", [(2, 1), pytest.param((1, 2), marks=pytest.mark.slow)], ids=["tp2", "pp2"])
def test_one_replica_over_two_ranks_values_as_transformers_and_steps_as_one_rank(
    critic_path, single_process, layout
):
    """Tensor parallel: the head whole on both ranks; pipeline parallel: on the last stage only.
    Their steps' losses are the one-rank FSDP critic's on the same rows."""
    ranks = run_ranks(f"{CHECKS}:two_ranks", 2, critic_path, *layout)
    one_rank = [step["loss"] for step in single_process["dense"]["fsdp_steps"]]
    for rank in ranks:
        assert rank["world"] == 2
        assert rank["values_diff"] < 1e-5
        assert rank["losses"] == pytest.approx(one_rank, rel=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed")
def test_on_a_gpu_the_megatron_critic_equals_the_fsdp_critic(critic_path):
    out = run_isolated(f"{CHECKS}:on_the_device", critic_path)
    assert out["platform"] in ("cuda", "rocm")
    assert out["first_values_diff"] < 1e-4 and out["values_diff_after"] < 1e-4
    for fsdp, megatron in zip(out["fsdp_steps"], out["megatron_steps"], strict=True):
        assert megatron["loss"] == pytest.approx(fsdp["loss"], rel=1e-4)
