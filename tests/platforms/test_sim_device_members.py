"""The new platform members on the simulated NPU (ROLL_DEVICE=npu-sim, in processes of their
own): what torch_npu answers, modelled by the simulation. All results are simulated."""

from tests.isolated import checks_in_one_process, run_isolated

CHECKS = "tests.platforms.sim_member_checks"

# The checks with the default environment, in one process; those with an environment in their own.
shared = checks_in_one_process(CHECKS, ["profiling", "process_env"])


def test_ranges_reach_mstx_and_the_profiler_sees_the_host_kernels(shared):
    r = shared("profiling")
    assert r["recorded"] == [
        ["range_start", "step", 1],
        ["range_start", "forward", 2],
        ["mark", "loss", 0],
        ["range_end", "", 2],
        ["range_end", "", 1],
    ]
    assert r["activity"] == "ProfilerActivity.CPU" and "aten::sum" in r["profiled_ops"]
    for member in ("profiler_start", "profiler_stop"):
        assert r[member].startswith(
            f"NotImplementedError: platform 'npu (simulated)' does not support profiling.{member}"
        )


def test_device_facts_name_the_simulation():
    r = run_isolated(
        f"{CHECKS}:device_facts", env={"ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7", "ROLL_SIM_NPU_COUNT": "4"}
    )
    assert r["name"] == r["arch"] == r["properties_name"] == "Ascend910B2 (simulated)"
    assert r["total"] == 64 << 30
    assert r["uuid"] == "NPU-5", "the physical id of visible device 1"
    assert (
        "does not support facts.device_capability: Ascend devices have no compute capability"
        in r["capability"]
    )
    assert r["on_device"] and not r["cpu_on_device"]
    # the members added for the frameworks' remaining needs
    assert r["uuid_index"] == 2 and r["bare_uuid_index"] == 3 and r["visible"] == ["4", "5", "6", "7"]
    assert "no visible device has UUID NPU-1 (check ASCEND_RT_VISIBLE_DEVICES)" in r["unknown_uuid"]
    assert r["debug"] == {"ASCEND_MODULE_LOG_LEVEL": "HCCL=0"}
    assert r["ports"] == {"HCCL_HOST_SOCKET_PORT_RANGE": "auto", "HCCL_NPU_SOCKET_PORT_RANGE": "auto"}
    assert r["connections"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert r["switch_off"] == r["kernel_build"] == {} and r["attention"] == "auto"
    for member in ("pci", "numa"):  # no npu-smi beside the simulation: named, never a guess
        assert "does not support topology.pci_bus_id: npu-smi is not installed here" in r[member]
    assert r["register"] == r["unregister"] == "", "torch_npu's cudart() registers host memory"
    for failed in ("register_twice", "unregister_again"):  # the runtime's status, raised with its name
        assert r[failed].startswith("RuntimeError: platform 'npu (simulated)': cudaHost")
        assert r[failed].endswith("failed with status 100000")
    assert "does not support kernels.set_dnn_library_enabled" in r["dnn"]


def test_memory_group_follows_the_ledger_and_the_fraction():
    r = run_isolated(f"{CHECKS}:memory", env={"ROLL_SIM_NPU_MEMORY_BYTES": str(64 << 20)})
    assert r["allocated"] == 1 << 20 and r["reserved_peak"] == r["max_reserved"] >= 1 << 20
    assert r["reserved_after_free"] == 1 << 20, "freed into the cache, as torch_npu's allocator keeps it"
    assert r["reserved_after_empty_cache"] == 0
    assert r["over_fraction"].startswith("OutOfMemoryError: NPU out of memory") and r["under_fraction"] == ""
    assert r["settings"] == {"expandable_segments": "False"}
    assert "unrecognized allocator setting 'no_such_key:1'" in r["bad_setting"]
    assert not r["pinned"] and r["pin_is_identity"]
    assert r["used"] == 0, "nothing lives on the device at the end of the check"
    # memory history: one kept and one freed allocation, with the stack that made them
    assert r["trace"] == [["alloc", 3 << 10], ["alloc", 5 << 10], ["free_completed", 5 << 10]]
    assert r["segments"] == [3 << 10] and r["stack_names_this_check"] and r["block_stack_names_this_check"]
    # "state": live storages keep their stacks, no events are added; segments are typed by size
    assert r["state_trace_unchanged"] and r["segment_types"] == {"3072": "small", "2097152": "large"}
    assert "memory history 'enabled' must be None, 'state' or 'all'" in r["bad_mode"]


def test_rng_of_all_devices_and_determinism():
    r = run_isolated(f"{CHECKS}:rng_and_determinism", env={"ROLL_SIM_NPU_COUNT": "4"})
    assert r["states"] == 4 and r["same"] and r["enabled"]
    assert r["env"] == {"HCCL_DETERMINISTIC": "true", "CLOSE_MATMUL_K_SHIFT": "1"}


def test_process_env_is_the_npu_kind(shared):
    r = shared("process_env")
    assert r["collective"] == {"HCCL_CONNECT_TIMEOUT": "1200", "HCCL_EXEC_TIMEOUT": "1200"}
    assert r["rank"] == {
        "ASCEND_RT_VISIBLE_DEVICES": "5",
        "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1",
    }
    assert r["training"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} and r["ray_ids_outside_ray"] == []
    assert r["noset"] == {"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"}
    assert r["pinned"] == {"ASCEND_RT_VISIBLE_DEVICES": "6,7", **r["noset"]}
