"""The Megatron-core trainer on Qwen3 and Qwen3-MoE: QK-norm and MoE layers built from the HF
config, logprobs equal to transformers' on the same weights, the export under transformers' names
(experts stacked as the engines take them), routing metrics each step, expert parallelism over
gloo ranks with the all-to-all dispatcher, and the layouts refused before any worker starts."""

import pytest

from roll_device.errors import ConfigError
from strategies.training.local_ranks import run_ranks
from strategies.training.megatron import MegatronTrainStrategy
from tests.configs import trainer_settings


@pytest.fixture(scope="module")
def qwen3_rank(tiny_moe_path, tmp_path_factory):
    from roll_device.models.tiny import make_tiny_model

    dense = make_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"), architecture="qwen3")
    (rank,) = run_ranks(
        "tests.strategies.training.megatron_moe_checks:qwen3_models", 1, str(dense), tiny_moe_path
    )
    return rank


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_logprobs_equal_transformers_and_the_export_has_its_names(qwen3_rank, model):
    out = qwen3_rank[model]
    assert out["logprob_diff"] < 1e-5
    assert out["exported_names"] == out["hf_names"]
    assert out["export_diff"] == 0.0


def test_qk_norms_and_stacked_experts_are_exported(qwen3_rank):
    assert "model.layers.1.self_attn.q_norm.weight" in qwen3_rank["dense"]["exported_names"]
    assert "model.layers.1.mlp.experts.gate_up_proj" in qwen3_rank["moe"]["exported_names"]


def test_replayed_routes_move_megatrons_logprobs_as_they_move_transformers(qwen3_rank):
    forced = qwen3_rank["moe"]["forced_routes"]
    assert forced["vs_own"] > 1e-3, "other experts, other logprobs"
    assert forced["vs_transformers"] < 1e-5


def test_moe_steps_report_routing_train_and_export_what_the_trainer_computes(qwen3_rank):
    out = qwen3_rank["moe"]
    first, second = out["steps"]
    assert second["loss"] < first["loss"]
    for step in out["steps"]:
        assert 1.9 < step["router_aux_loss"] < 8.0, "near top-k (2) when balanced, at most E (8)"
        assert 1.0 <= step["expert_imbalance"] <= 4.0, "between balanced and all tokens on 2 of 8"
    assert out["trained_export_diff"] < 1e-5


@pytest.mark.slow  # two spawned ranks with megatron: about a minute here
@pytest.mark.parametrize(
    "env, precision",
    [
        ({}, ""),
        # A SIMULATION: the ranks on npu:0 and npu:1 of the simulated NPU, megatron-core through the
        # CUDA redirects, the simulated hccl (gloo); fp32, the CPU's, to compare with the plain step.
        ({"ROLL_DEVICE": "npu-sim"}, "fp32"),
    ],
    ids=["cpu", "simulated-npu"],
)
def test_expert_parallel_two_ranks_equal_a_plain_step(tiny_moe_path, tmp_path, env, precision):
    checkpoint = str(tmp_path / "checkpoint")
    ranks = run_ranks(
        "tests.strategies.training.megatron_moe_checks:expert_parallel",
        2,
        tiny_moe_path,
        checkpoint,
        precision,
        env=env,
    )
    for rank in ranks:
        assert rank["local_experts"] == 4 and rank["expert_group_size"] == 2
        assert rank["logprob_diff"] < 1e-5 and rank["export_diff"] == 0.0
        assert rank["exported_names"] == rank["hf_names"]
        assert rank["grad_norm"] == pytest.approx(rank["reference_grad_norm"], rel=1e-5)
        assert rank["weight_diff_vs_reference"] < 1e-3  # Adam's first update is lr-sized: 5e-3
        assert len(rank["steps"]) == 2 and rank["trained_export_diff"] < 1e-5
        assert rank["reload_diff"] == 0.0 and rank["checkpoint_export_diff"] == 0.0
    assert ranks[0]["steps"] == ranks[1]["steps"]


@pytest.mark.parametrize(
    "config, message",
    [
        ({"expert_parallel": 3}, r"trainer.expert_parallel=3 must divide the model's num_experts \(8\)"),
        (
            {"expert_tensor_parallel": 2},
            r"trainer.expert_tensor_parallel=2: experts split over ranks train wrong",
        ),
        ({"tensor_parallel": 2}, r"tensor_parallel=2 with a mixture of experts needs megatron's sequence"),
    ],
)
def test_expert_layouts_the_model_cannot_take_are_refused(tiny_moe_path, config, message):
    with pytest.raises(ConfigError, match=message):
        MegatronTrainStrategy.check_model(None, trainer_settings("megatron", **config), tiny_moe_path)


def test_expert_parallel_on_a_dense_model_is_refused(tiny_model_path):
    with pytest.raises(ConfigError, match="trainer.expert_parallel=2 needs a mixture of experts"):
        MegatronTrainStrategy.check_model(
            None, trainer_settings("megatron", expert_parallel=2), tiny_model_path
        )


def test_expert_parallel_on_fsdp_is_refused_when_the_section_is_read():
    with pytest.raises(ConfigError) as refused:
        trainer_settings("fsdp", expert_parallel=2)
    assert str(refused.value).startswith(
        "trainer.expert_parallel=2: the fsdp trainer has no expert parallelism"
    )
    assert "\n" not in str(refused.value)


def test_the_devices_must_hold_whole_expert_parallel_groups():
    """Expert-parallel ranks are data-parallel ranks of the dense layers: a replica's workers are
    a multiple of both splits (the run's check of roles.<role>.num_devices reads this)."""
    settings = trainer_settings("megatron", tensor_parallel=2, expert_parallel=4, expert_tensor_parallel=1)
    assert settings.model_parallel_size == 4
    assert settings.model_parallel_layout().endswith("= 4 x 1 x 1 (their least common multiple, 4)")
    assert trainer_settings("megatron", tensor_parallel=2, expert_parallel=3).model_parallel_size == 6


def test_a_family_with_experts_megatron_does_not_convert_is_named(tmp_path):
    from transformers import Qwen2MoeConfig

    Qwen2MoeConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=2).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"not 'qwen2_moe' \(a model with 60 experts per layer\)"):
        MegatronTrainStrategy.check_model(None, trainer_settings("megatron"), str(tmp_path))
