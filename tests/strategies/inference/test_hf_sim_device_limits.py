"""The HF strategy where an Ascend NPU is strict, checked on the SIMULATED NPU (ROLL_DEVICE=npu-sim,
in a process of its own): captured decode steps equal to eager, and the real bugs caught before
serving (a host read in the captured step, more graphs than streams, an offload that leaves the
weights on the device, a model larger than the device). All results are simulations."""

import pytest

from tests.isolated import run_isolated


@pytest.fixture(scope="module")
def sim(tiny_model_path):
    return run_isolated(
        "tests.strategies.inference.sim_checks:hf_device_limits", tiny_model_path, timeout=240
    )


def test_decode_graphs_equal_eager_at_every_batch_size(sim):
    assert sim["platform"] == "npu (simulated)" and sim["greedy_graphs_equal_eager"]


def test_a_host_read_in_the_decode_step_fails_at_capture(sim):
    error = sim["item_in_step"]
    assert error.startswith("RuntimeError: NPU function error") and "error code is 107027" in error
    assert (
        "Tensor.item()" in error and "keep host reads and synchronization out of the captured step" in error
    )


def test_more_capture_sizes_than_streams_fail_before_serving_with_the_advice(sim):
    error = sim["five_sizes_three_streams"]
    assert "207008" in error and "Stream resources are insufficient" in error
    for advice in ("capture fewer sizes", "rollout.capture_sizes", "FULL_DECODE_ONLY", "STREAMS_PER_DEVICE"):
        assert advice in error
    assert sim["three_sizes_captured"] == [16, 8, 2]


def test_an_offload_that_leaves_the_weights_is_caught_by_mem_get_info(sim):
    weights = sim["offload_weight_bytes"]
    assert sim["offload_resident_started"] > weights  # weights, KV cache, static buffers, graph pool
    assert sim["offload_resident_after"] == 0
    assert sim["buggy_offload_resident_after"] >= weights  # what a check after offload sees


def test_a_model_larger_than_the_device_fails_with_out_of_memory_not_a_hang(sim):
    error = sim["too_large"]
    assert error.startswith("OutOfMemoryError: NPU out of memory. Tried to allocate")
    assert "total capacity" in error and "ROLL_SIM_NPU_MEMORY_BYTES" in error
    assert sim["too_large_seconds"] < 30
