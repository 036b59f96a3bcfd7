"""FSDP2 trainer: 2 gloo ranks on the CPU (each with its own rows), and one rank on the simulated NPU."""

from __future__ import annotations

import itertools

import pytest
import torch

import roll_device as rd
from roll_device.errors import ConfigError
from strategies.registry import strategy_class
from strategies.training.fsdp import FsdpTrainStrategy
from strategies.training.local_ranks import run_ranks
from tests.configs import trainer_settings
from tests.isolated import run_isolated


@pytest.fixture(scope="module")
def two_ranks(tiny_model_path, tmp_path_factory):
    checkpoint = str(tmp_path_factory.mktemp("fsdp-checkpoint"))
    return run_ranks("tests.strategies.training.fsdp_checks:two_ranks", 2, tiny_model_path, checkpoint)


def test_registered_for_every_kind():
    for kind in ("cuda", "rocm", "npu", "cpu"):
        assert strategy_class("train", "fsdp", kind) is FsdpTrainStrategy


def test_logprobs_equal_plain_transformers_forward(two_ranks):
    for rank in two_ranks:
        assert rank["logprob_diff"] < 1e-5


def test_forward_only_leaves_every_parameter_sharded(two_ranks):
    """No gathered root parameters are left behind by a forward that has no backward."""
    for rank in two_ranks:
        assert rank["parameter_types_after_forward"] == ["DTensor"]


def test_two_rank_step_equals_one_plain_step_on_both_ranks_rows(two_ranks):
    for rank in two_ranks:
        assert rank["grad_norm"] == pytest.approx(rank["reference_grad_norm"], rel=1e-5)
        assert rank["weight_diff_vs_reference"] < 1e-4  # Adam's first update is lr-sized: 1e-2


def test_loss_decreases_on_a_fixed_batch(two_ranks):
    losses = two_ranks[0]["losses"]
    assert all(later < earlier for earlier, later in itertools.pairwise(losses))
    assert losses[-1] < 0.8 * losses[0]
    assert two_ranks[1]["losses"] == losses  # the loss is reduced over both ranks


def test_export_yields_hf_names_that_load_with_identical_logits(two_ranks):
    for rank in two_ranks:
        assert rank["exported_names"] == rank["hf_names"]
        assert rank["export_logprob_diff"] < 1e-5


def test_a_sync_export_gathers_the_engines_dtype_to_the_sender_alone(two_ranks):
    """Rank 0 (the sender) gets every tensor in bf16; rank 1 yields the names with None: it only
    sends its bf16 shards, rank 0 only receives (no broadcast, no fp32 on the wire)."""
    for rank in two_ranks:
        assert rank["sync_export_names"] == rank["exported_names"]
        assert rank["sync_export_matches"]
    assert two_ranks[0]["sync_export_calls"] == [("recv", torch.bfloat16)]
    assert two_ranks[1]["sync_export_calls"] == [("send", torch.bfloat16)]


def test_checkpoint_reload_gives_identical_next_step(two_ranks):
    for rank in two_ranks:
        after_save, after_load = rank["step_after_save"], rank["step_after_load"]
        assert after_load == pytest.approx(after_save, rel=1e-6)
        assert rank["checkpoint_weight_diff"] < 1e-6


def test_uneven_batches_and_offloaded_use_raise_on_every_rank(two_ranks):
    for rank in two_ranks:
        assert rank["uneven_error"].startswith("ConfigError: data-parallel ranks got batches of 2 to 3 rows")
        assert rank["offloaded_error"].startswith("TrainerStateError: the FSDP trainer is offloaded")


def test_turns_leave_shards_and_optimizer_state_identical_through_one_host_buffer(two_ranks):
    """Offload and reload twice after training: parameters, gradients and Adam state bit-identical,
    nothing left in their storages while offloaded, and the second turn allocates no host memory."""
    for rank in two_ranks:
        assert rank["optimizer_state_tensors"] > 0
        assert rank["offloaded_bytes"] == 0
        assert rank["identical_after_turn_0"] and rank["identical_after_turn_1"]
        assert (rank["host_allocations"], rank["same_host_buffer"]) == (1, True)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"lr": 0.0}, "trainer.lr=0.0: input should be greater than 0"),
        ({"micro_batch_size": 0}, "trainer.micro_batch_size=0: input should be greater than or equal to 1"),
        ({"mixed_precision": "fp8"}, "trainer.mixed_precision='fp8': input should be 'bf16' or 'fp32'"),
        ({"learning_rate": 1.0}, "unknown key trainer.learning_rate: the keys here are name, lr,"),
    ],
)
def test_bad_config_is_rejected_when_the_section_is_read(config, message):
    with pytest.raises(ConfigError) as refused:
        trainer_settings("fsdp", **config)
    assert str(refused.value).startswith(message)


def test_missing_model_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match="holds no config.json"):
        FsdpTrainStrategy(rd.get_platform("cpu")).initialize(str(tmp_path), trainer_settings("fsdp"))


@pytest.fixture(scope="module")
def simulated_npu(tiny_model_path):
    return run_isolated("tests.strategies.training.fsdp_checks:simulated_npu_step", tiny_model_path)


def test_simulated_npu_runs_steps_like_the_cpu(simulated_npu):
    """Simulation: one rank of FSDP2 on npu:0 over the hccl stand-in."""
    out = simulated_npu
    assert out["platform"] == "npu (simulated)"
    assert (out["backend"], out["param_type"], out["param_device"]) == ("hccl", "DTensor", "npu:0")
    assert out["logprob_diff_vs_cpu"] < 1e-5
    assert out["npu_losses"] == pytest.approx(out["cpu_losses"], rel=1e-5)


def test_simulated_npu_offload_frees_device_memory_and_reload_resumes_training(simulated_npu):
    """Simulation: offload moves the shards' bytes to the host (the parameter stays on the device,
    its storage empty) and frees simulated device memory; reload brings them back and the fourth
    step (after the round trip) matches the CPU trainer's."""
    out = simulated_npu
    assert (out["param_device_offloaded"], out["param_bytes_offloaded"]) == ("npu:0", 0)
    assert out["allocated_after_offload"] < out["allocated_before_offload"] / 2
    assert out["param_device_reloaded"] == "npu:0"
    assert out["allocated_after_reload"] >= out["allocated_before_offload"] / 2
    turns = out["turns"]  # two more turns: bit-identical, one host buffer (a device kind copies)
    assert (
        turns["offloaded_bytes"] == 0 and turns["identical_after_turn_0"] and turns["identical_after_turn_1"]
    )
    assert (turns["host_allocations"], turns["same_host_buffer"]) == (1, True)


def test_a_second_trainer_in_the_process_stays_a_frozen_reference(two_ranks):
    """Two FSDP instances on 2 gloo ranks, as the pipeline hosts a reference beside the policy."""
    for rank in two_ranks:
        reference = rank["hosted_reference"]
        assert reference["start_diff"] < 1e-6
        assert reference["reference_moved"] == 0.0 and reference["policy_moved"] > 1e-3


@pytest.fixture(scope="module")
def one_rank(tiny_model_path):
    """The checks one CPU rank answers, run in one spawned rank."""
    (rank,) = run_ranks("tests.strategies.training.fsdp_checks:one_rank", 1, tiny_model_path)
    return rank


def test_export_is_a_snapshot_on_a_one_rank_cpu_mesh(one_rank):
    """On one CPU rank the gathered tensor is the parameter itself: the export copies it."""
    kept = one_rank["kept_export"]
    assert kept["weights_moved"] > 0 and kept["kept_changed"] == 0


def test_a_seq_mean_loss_is_the_same_in_any_micro_batch_split(one_rank):
    """The trainer weighs micro-batches by the loss's units (rows for the seq-mean modes)."""
    one_row, whole = one_rank["seq_mean"]["rows_1"], one_rank["seq_mean"]["rows_4"]
    assert one_row["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert one_row["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)


def test_an_entropy_bonus_raises_the_policys_entropy(one_rank):
    with_bonus, without = one_rank["entropy"]["coef_1.0"], one_rank["entropy"]["coef_0.0"]
    assert with_bonus[-1]["entropy"] > with_bonus[0]["entropy"] + 1e-3
    assert with_bonus[0]["grad_norm"] > 0 and without[0]["grad_norm"] == 0
    assert without[-1]["entropy"] == pytest.approx(without[0]["entropy"], abs=1e-7)
