"""The simulated NPU fails where an Ascend NPU fails: ACL graph capture and replay, what needs the
host during capture, the device's stream budget, graph memory pools and the memory capacity.

All results here are SIMULATIONS (ROLL_DEVICE=npu-sim, in processes of their own); the
models follow torch_npu and vLLM-Ascend as docs/simulation.md cites."""

import pytest

from tests.isolated import checks_in_one_process, run_isolated

CHECKS = "tests.sim.graph_checks"
SYNC = "error code is 107027"
HOST_COPY = "error code is 107030"

# The checks with the default environment that read no absolute memory, in one process; the others,
# with an environment or the device's whole memory (which sets its capacity), in their own.
shared = checks_in_one_process(CHECKS, ["replay", "capture_rules", "device_graph_tests"])


def test_replay_reruns_the_capture_on_the_same_tensors_and_refuses_the_host(shared):
    r = shared("replay")
    assert r["replays_match"] == [True, True] and r["same_output_memory"]
    assert r["non_blocking_copy_replayed"]
    refused = r["refused"]
    for name, code, what in [
        ("item", SYNC, "Tensor.item()"),
        ("bool", SYNC, "Tensor.item() or bool(tensor)"),
        ("equal", SYNC, "torch.equal"),
        ("synchronize", SYNC, "torch.npu.synchronize()"),
        ("tolist", HOST_COPY, "Tensor.tolist()"),
        ("cpu", HOST_COPY, "a copy to the host"),
        ("print", HOST_COPY, "printing a device tensor"),
        ("copy_to_host", HOST_COPY, "a blocking copy into a host tensor"),
    ]:
        assert refused[name].startswith("RuntimeError: NPU function error") and code in refused[name], name
        assert f"[simulated NPU] {what}" in refused[name], name
        assert refused[name + "_left_capture"], name
        assert "NPUGraph::replay without a preceding successful capture" in refused[name + "_no_replay"]
    assert "Not allow to synchronize captured-stream" in refused["item"]
    assert "synchronized memcpy failed, kind = 2" in refused["cpu"]


def test_torch_npu_capture_rules(shared):
    r = shared("capture_rules")
    assert "Called NPUGraph::pool() without a preceding successful capture" in r["pool_before_capture"]
    assert "Called NPUGraph::replay without" in r["replay_before_capture"]
    assert "NPU graphs must be captured on a non-default stream" in r["default_stream"]
    assert r["capturing_inside_outside"] == [True, False] and r["pool_is_handle"]
    assert (
        "already owns a captured graph. To capture a new graph, create a new instance" in r["capture_twice"]
    )
    assert "Capture must end on the same stream it began on" in r["end_on_other_stream"]
    assert "Do not support TASK_QUEUE_ENABLE = 2 during NPU graph capture" in r["task_queue_2"]


def test_graphs_past_the_stream_budget_fail_like_the_device_with_the_advice():
    r = run_isolated(f"{CHECKS}:stream_budget", env={"ROLL_SIM_NPU_STREAMS": "36"})
    fourth = r["fourth"]
    assert fourth.startswith("RuntimeError: capture_begin: NPU function error") and "207008" in fourth
    assert "Stream resources are insufficient" in fourth
    assert (
        "needs stream 37 of the device's 36 (ROLL_SIM_NPU_STREAMS), 3 of them held by captured graphs"
        in fourth
    )
    for advice in ("capture fewer sizes", "FULL_DECODE_ONLY", "STREAMS_PER_DEVICE"):
        assert advice in fourth
    assert r["after_reset"] == ""  # a reset graph gives its stream back
    assert r["graphs_on_npu1"] == 27 and "207008" in r["one_more"]  # a pool of 8 leaves 27


def test_graph_pools_are_shared_and_the_capacity_is_enforced():
    r = run_isolated(f"{CHECKS}:memory")
    mib = 1 << 20
    assert mib <= r["shared_pool_bytes"] < 1.1 * mib  # three graphs, one pool: one intermediate
    assert r["private_pools_bytes"] >= 3 * mib  # three pools: three intermediates
    assert r["held_until_empty_cache"] and r["free_plus_reserved_is_total"]
    assert r["after_empty_cache"] == mib  # x alone
    assert r["oom"].startswith(
        "OutOfMemoryError: NPU out of memory. Tried to allocate 3.00 MiB (NPU 0; 3.00 MiB total capacity; "
        "1.00 MiB already allocated; 1.00 MiB current active; 2.00 MiB free; 1.00 MiB reserved in total"
    )
    assert "ROLL_SIM_NPU_MEMORY_BYTES=3145728" in r["oom"] and r["fits"]
    assert "Tried to allocate 4.00 MiB" in r["oom_in_capture"] and r["no_capture_left"]


@pytest.mark.parametrize("check", ["device_graph_tests"])
def test_the_device_graph_tests_pass_on_the_simulated_npu(shared, check):
    r = shared(check)
    assert r == {"platform": "npu (simulated)", "passed": 2}
