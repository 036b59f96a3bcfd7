"""Megatron-core trainer on the CPU: one process, and on two gloo processes TP=2, PP=2, and 2
data-parallel ranks with the distributed optimizer, against transformers, a plain step and the
FSDP2 trainer."""

from __future__ import annotations

import itertools

import pytest
import torch

import roll_device as rd
from roll_device.cli import main
from roll_device.errors import ConfigError
from strategies.registry import strategy_class
from strategies.training.local_ranks import run_ranks
from strategies.training.megatron import MegatronTrainStrategy
from tests.configs import trainer_settings
from tests.isolated import run_isolated

LAYOUTS = {"tp2": (2, 1), "pp2": (1, 2), "dp2": (1, 1)}  # (tensor_parallel, pipeline_parallel) on 2 ranks


@pytest.fixture(scope="module", params=list(LAYOUTS))
def two_ranks(request, tiny_model_path, tmp_path_factory):
    checkpoint = str(tmp_path_factory.mktemp(f"megatron-{request.param}"))
    ranks = run_ranks(
        "tests.strategies.training.megatron_checks:two_ranks",
        2,
        tiny_model_path,
        *LAYOUTS[request.param],
        checkpoint,
    )
    return request.param, ranks


@pytest.fixture(scope="module")
def single_process(tiny_model_path, tmp_path_factory):
    checkpoint = str(tmp_path_factory.mktemp("megatron-single"))
    return run_isolated(
        "tests.strategies.training.megatron_checks:single_process", tiny_model_path, checkpoint
    )


def test_registered_for_the_kinds_it_has_adapters_for():
    for kind in ("cuda", "rocm", "npu", "cpu"):
        assert strategy_class("train", "megatron", kind) is MegatronTrainStrategy


def test_logprobs_match_transformers(two_ranks):
    for rank in two_ranks[1]:
        assert rank["logprob_diff"] < 1e-5


def test_data_parallel_rank_and_size_follow_the_layout(two_ranks):
    layout, ranks = two_ranks
    expected = [[0, 2], [1, 2]] if layout == "dp2" else [[0, 1], [0, 1]]
    assert [rank["data_parallel"] for rank in ranks] == expected


def test_step_matches_a_plain_step_on_the_same_rows(two_ranks):
    for rank in two_ranks[1]:
        assert rank["grad_norm"] == pytest.approx(rank["reference_grad_norm"], rel=1e-5)
        assert rank["weight_diff_vs_reference"] < 1e-3  # Adam's first update is lr-sized: 5e-3


def test_loss_decreases(two_ranks):
    _, ranks = two_ranks
    losses = ranks[0]["losses"]
    assert all(later < earlier for earlier, later in itertools.pairwise(losses))
    assert ranks[1]["losses"] == pytest.approx(losses)


def test_exported_weights_load_into_transformers_with_matching_logits(two_ranks):
    for rank in two_ranks[1]:
        assert rank["exported_names"] == rank["hf_names"]
        assert rank["export_logprob_diff"] < 1e-5
        assert rank["offload_reload_weight_diff"] == 0.0


def test_a_sync_export_yields_tensors_on_the_sending_rank_alone(two_ranks):
    for rank in two_ranks[1]:  # rank 1 sends here: the other one yields the names with None
        assert rank["sync_export_names"] == rank["exported_names"]
        assert rank["sync_export_matches"]


def test_each_rank_exports_its_own_slices_of_the_whole_export(two_ranks):
    """`export_shards` (the sharded sync's): the ranks' slices make the whole export; each tensor
    is planned to be sent once; a tensor- or pipeline-parallel rank holds part of the model, and
    data-parallel replicas split the sending."""
    layout, ranks = two_ranks
    for rank in ranks:
        assert rank["sharded_names"] == rank["exported_names"]
        assert rank["sharded_export_diff"] == 0.0
        assert sum(rank["planned_bytes"]) == rank["whole_bytes"]
        assert max(rank["planned_bytes"]) < rank["whole_bytes"]
        if layout == "dp2":  # replicas: each holds it all, and sends part
            assert rank["slice_bytes"] == rank["whole_bytes"]
        else:
            assert rank["slice_bytes"] < rank["whole_bytes"]


def test_checkpoint_reload_gives_identical_next_step(two_ranks):
    for rank in two_ranks[1]:
        assert rank["step_after_load"] == pytest.approx(rank["step_after_save"], rel=1e-6)
        assert rank["checkpoint_weight_diff"] < 1e-6


def test_ranks_of_one_replica_must_hold_the_same_rows_data_parallel_ranks_their_own(two_ranks):
    layout, ranks = two_ranks
    for rank in ranks:
        if layout == "dp2":
            assert rank["own_rows_error"] == ""
        else:
            assert rank["own_rows_error"].startswith(
                "ConfigError: ranks of one model replica (its tensor- and"
            )


def test_a_checkpoint_refuses_another_layout(two_ranks):
    layout, ranks = two_ranks
    tp, pp = LAYOUTS[layout]
    written = (
        f"{{'tensor_parallel': {tp}, 'pipeline_parallel': {pp}, 'data_parallel': {2 // (tp * pp)}, "
        "'expert_parallel': 1}"
    )
    for rank in ranks:
        assert (
            rank["layout_error"].startswith("ConfigError: checkpoint '")
            and f"the layout {written}" in rank["layout_error"]
        )
        assert rank["layout_error"].endswith("reload it with the same layout")


def test_logprobs_and_step_match_fsdp_on_the_same_weights(single_process):
    out = single_process
    assert out["logprob_diff_vs_fsdp"] < 1e-5
    fsdp, megatron = out["fsdp_step"], out["megatron_step"]
    assert megatron["loss"] == pytest.approx(fsdp["loss"], rel=1e-6)
    assert megatron["grad_norm"] == pytest.approx(fsdp["grad_norm"], rel=1e-5)
    assert out["weight_diff_vs_fsdp"] < 1e-4  # decaying a norm (at 1.0) would move it by 5e-4


def test_offload_frees_storage_and_reload_restores_the_same_next_step(single_process):
    out = single_process
    assert out["storage_bytes_offloaded"] == 0 and out["storage_bytes_reloaded"] > 0
    assert out["offloaded_error"].startswith("TrainerStateError: the Megatron trainer is offloaded")
    assert out["step_after_reload"] == out["step_without_offload"]
    assert out["reload_weight_diff"] == 0.0


def test_single_process_checkpoint_and_its_own_group(single_process):
    out = single_process
    assert out["step_after_load"] == pytest.approx(out["step_after_save"], rel=1e-6)
    assert out["group_released"]


def test_bf16_compute_trains_like_fsdp_bf16(single_process):
    out = single_process
    fsdp, megatron = out["bf16_fsdp_losses"], out["bf16_megatron_losses"]
    assert megatron == pytest.approx(fsdp, rel=2e-3)  # bf16 rounding differs between the two
    assert megatron[1] < megatron[0]
    assert out["bf16_megatron_export_dtypes"] == ["torch.bfloat16"]


@pytest.mark.parametrize(
    "config, message",
    [
        ({"tensor_parallel": 3}, "tensor_parallel=3 must divide the model's num_attention_heads"),
        ({"pipeline_parallel": 3}, r"pipeline_parallel=3 must divide the model's num_hidden_layers \(2\)"),
        (
            {"pipeline_parallel": 2},
            "trainer.tensor_parallel x trainer.pipeline_parallel = 1 x 2 must divide the world size 1",
        ),
    ],
)
def test_bad_layouts_are_rejected_before_megatron_starts(tiny_model_path, config, message):
    with pytest.raises(ConfigError, match=message):
        MegatronTrainStrategy(rd.get_platform("cpu")).initialize(
            tiny_model_path, trainer_settings("megatron", **config)
        )


@pytest.mark.parametrize(
    "config, message",
    [
        ({"tensor_parallel": 0}, "trainer.tensor_parallel=0: input should be greater than or equal to 1"),
        ({"mindspeed": "on"}, "trainer.mindspeed='on': input should be a valid dictionary"),
    ],
)
def test_bad_values_are_rejected_when_the_section_is_read(config, message):
    with pytest.raises(ConfigError) as refused:
        trainer_settings("megatron", **config)
    assert str(refused.value).startswith(message)


def test_unsupported_model_family_is_named(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=64, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="converts the qwen2, llama, qwen3, qwen3_moe families, not 'gpt2'"):
        MegatronTrainStrategy(rd.get_platform("cpu")).initialize(str(tmp_path), trainer_settings("megatron"))


@pytest.mark.slow  # tied embeddings run by default over two pipeline stages (below), the harder layout
def test_llama_with_tied_embeddings(tmp_path):
    out = run_isolated("tests.strategies.training.megatron_checks:llama_tied", str(tmp_path / "tiny-llama"))
    assert out["logprob_diff"] < 1e-5
    assert out["exported_names"] == out["hf_names"]  # the tied head once, as the embedding
    assert out["megatron_step"]["grad_norm"] == pytest.approx(out["fsdp_step"]["grad_norm"], rel=1e-5)
    # Adam's first update is lr * g / (|g| + eps): the odd element whose gradient is near eps
    # moves differently under another summation order; a wrong mapping would move whole tensors.
    assert out["weight_diff_vs_fsdp"] < 1e-3 and out["weights_off_fraction"] < 1e-3


def test_llama_with_tied_embeddings_over_two_pipeline_stages(tmp_path):
    """The embedding lives on stage 0 and a copy in stage 1's output layer; Megatron sums their
    gradients, so a step equals a plain one-process step and the copy moves with the embedding.
    The checkpoint holds the embedding alone; `roll-device export` ties the head to it."""
    from transformers import AutoModelForCausalLM

    directory, checkpoint = str(tmp_path / "tiny-llama"), tmp_path / "checkpoints" / "step_1" / "policy"
    run_isolated("tests.strategies.training.megatron_checks:make_tied_llama", directory)
    ranks = run_ranks(
        "tests.strategies.training.megatron_checks:llama_tied_pipeline", 2, directory, str(checkpoint)
    )
    assert [rank["layers_held"] for rank in ranks] == [2, 2]
    for rank in ranks:
        assert rank["logprob_diff"] < 1e-5
        assert rank["step"]["grad_norm"] == pytest.approx(rank["reference_grad_norm"], rel=1e-5)
        assert rank["exported_names"] == rank["hf_names"]
        assert rank["weight_diff_vs_reference"] < 1e-3 and rank["weights_off_fraction"] < 1e-3
    assert ranks[1]["head_copy_diff"] == 0.0 and "head_copy_diff" not in ranks[0]
    assert main(["export", str(checkpoint), str(tmp_path / "hf"), "--model", directory]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert exported.lm_head.weight is exported.model.embed_tokens.weight
    assert torch.equal(exported.model.embed_tokens.weight.detach(), torch.from_numpy(ranks[0]["embedding"]))
