"""The simulated NPU (ROLL_DEVICE=npu-sim) runs the unmodified NPU platform class.

All results here are simulations: CPU compute behind tensors that report `npu:N`.
"""

from tests.isolated import checks_in_one_process, run_isolated

CHECKS = "tests.sim.sim_checks"
# The checks with the default environment that leave nothing behind (memory is read as deltas),
# in one process; the one that once ended its process, and those with an environment, in their own.
shared = checks_in_one_process(
    CHECKS,
    [
        "allocator_cache",
        "metadata_after_ops",
        "qwen_step",
        "hccl_allreduce",
        "data_swap",
        "device_scalars_to_host",
        "backward_on_a_later_device",
        "parameter_marks_on_the_device",
    ],
)


def test_npu_platform_contract_on_simulated_npu():
    r = run_isolated("tests.sim.sim_checks:platform_contract", env={"ROLL_SIM_NPU_COUNT": "4"})
    assert r["name"] == "npu (simulated)" and r["kind"] == "npu" and r["count"] == 4
    assert r["current"] == 2 and r["device"] == "npu:2" and r["tensor_device"] == "npu:2"
    assert "device index 4 out of range: 4 visible" in r["bad_index"]
    assert r["allocated_delta"] == 4096, "a view shares its storage: counted once"
    assert r["view_shares_storage"] and r["storage_nbytes"] == 4096
    assert r["free_plus_allocated_is_total"]
    assert r["after_free_delta"] == 0 and r["peak_delta"] >= 4096 and r["peak_after_reset_delta"] == 0
    assert r["rng_roundtrip"] and r["seeded"]
    assert r["saved_device"] == "npu:2" and r["saved_values"] == [0.0, 1.0, 2.0]
    assert r["graphs"] is True and r["graph_class"] == "NPUGraph"


def test_freed_memory_stays_reserved_until_empty_cache_as_torch_npus_allocator_keeps_it(shared):
    r = shared("allocator_cache")
    assert r["freed_still_reserved"] == 4 and r["free_still_reduced"], (
        "freed into the cache, not to the device"
    )
    assert r["reused"] == 4, "a smaller allocation takes cached memory"
    assert r["grown"] == 9, "a larger one takes the rest of the cache and grows by the difference"
    assert r["after_empty_cache"] == 0 and r["free_back"]


def test_tiny_qwen2_step_matches_cpu(shared):
    r = shared("qwen_step")
    assert r["param_device"] == "npu:0"
    assert abs(r["cpu_loss"] - r["npu_loss"]) <= 1e-5
    assert r["max_weight_diff"] <= 1e-5


def test_two_process_hccl_allreduce(shared):
    r = shared("hccl_allreduce")
    assert r["exitcodes"] == [0, 0]
    for rank, (got_rank, backend, device, reduced, gathered) in enumerate(r["ranks"]):
        assert got_rank == rank and backend == "hccl" and device == f"npu:{rank}"
        assert reduced == [3.0] * 4 and gathered == [3.0] * 8


def test_swapping_a_tensors_data_moves_it_onto_the_other_memory(shared):
    r = shared("data_swap")
    assert r["allocated_after_swap"] == 24, "the parameter's own 16 bytes are freed"
    assert r["computes_with"] == [2.0, 3.0, 4.0, 5.0] and r["grad"] == [2.0] * 4
    assert r["buffer_after_update"] == [0.0, 1.0, 3.0, 4.0, 5.0, 6.0], "written into the buffer"
    assert r["data_type"] == "SimNpuTensor"


def test_a_list_of_device_scalars_becomes_a_host_tensor(shared):
    r = shared("device_scalars_to_host")
    assert r == {"device": "cpu", "values": [[3.0, 4.0]], "norm": 5.0}


def test_backward_runs_on_a_device_after_the_first(shared):
    r = shared("backward_on_a_later_device")
    assert r["grad_device"] == "npu:1" and r["grad_diff"] <= 1e-6


def test_the_megatron_trainers_move_keeps_parameter_marks_module_to_drops_here(shared):
    r = shared("parameter_marks_on_the_device")
    assert r == {"Module.to": ["npu:0", "lost"], "trainer": ["npu:0", False]}


def test_metadata_follows_the_data_after_every_op(shared):
    r = shared("metadata_after_ops")
    assert r["arange"] == [5] and r["eye"] == [2, 3]
    assert r["arange_bytes"] == 4000 and r["resized_bytes"] == 8000, "storage grown in place is counted"
    assert r["unsqueeze_"] == [1, 2, 3] and r["t_"] == [1, 3] and r["resize_"] == [2, 5]
    assert r["matmul_1d"] == [4]
    assert r["matmul_out"] == [[4.0] * 3] * 2, "refused before: the view seemed other memory than `out`"
    assert r["conj"] is True and r["hfft_grad"] == [8]
    assert r["to_cpu"] == "cpu"
    assert r["sparse"] == ["torch.sparse_coo", "npu:0", "torch.sparse_csr", [1.0, 1.0, 1.0]]
    assert r["histc_int"] == ["torch.int32", [1, 1, 0, 2, 0, 0, 0, 1]], "integers counted as a device counts"


def test_device_limits_are_refused_in_torch_npus_words():
    r = run_isolated(
        "tests.sim.sim_checks:device_limits",
        env={"ROLL_SIM_NPU_COUNT": "2", "ROLL_SIM_NPU_MEMORY_BYTES": str(64 << 20)},
    )
    for how in ("factory", "copy", "set_device"):  # npu:2 allocated before: the count was not checked
        assert r[how].startswith(
            "RuntimeError: NPU function error: c10_npu::SetDevice(device), error code is 107001"
        )
        assert "[Error]: Invalid device ID." in r[how] and "Expected value: [0, 2)." in r[how]
        assert r[how].endswith(
            "npu:2 does not exist: ROLL_SIM_NPU_COUNT=2 (pick an index below 2, or raise ROLL_SIM_NPU_COUNT)"
        )
    assert r["last"] == "npu:1"
    assert r["int_fraction"] == "TypeError: Invalid type for fraction argument, must be `float`"
    # torch_npu's wording: the device's total capacity, and what the fraction allows beside it.
    assert "(NPU 0; 64.00 MiB total capacity; " in r["oom"] and "; 16.00 MiB allowed; " in r["oom"]
    assert (
        "[simulated NPU] this process may reserve 16.00 MiB: set_per_process_memory_fraction(0.25) of the "
        "device's 64.00 MiB (ROLL_SIM_NPU_MEMORY_BYTES=67108864)"
    ) in r["oom"]
    assert r["whole_device"] == ""


def test_sparse_mm_reduce_backward_matches_the_cpu():
    # In a process of its own: before the fix the backward of "amax"/"amin" ended it (exit 139).
    r = run_isolated("tests.sim.sim_checks:sparse_mm_reduce_backward")
    assert r == {reduce: [True, "npu:0"] for reduce in ("sum", "mean", "amax", "amin")}
