"""Weight-sync paths with the simulated NPU (`npu-sim`) at one or both ends: a simulation (CPU
compute behind tensors that report `npu:N`, hccl that is gloo underneath), labelled as such.

The trainer end exports its parameters straight from `npu:0`; a rollout end on the simulated NPU
gets its tensors on `npu:0`, one on the CPU gets them on the CPU.
"""

from __future__ import annotations

import pytest

from tests.comm.scenarios import assert_mixed_synced, assert_synced, run_twice, sync_mixed_twice


@pytest.mark.parametrize(
    ("src", "dst", "forced", "placement", "expected", "device"),
    [
        (
            "npu-sim",
            "npu-sim",
            "auto",
            {"colocated": True},
            "colocated: npu -> npu via host shared memory",
            "npu:0",
        ),
        (
            "npu-sim",
            "npu-sim",
            "auto",
            {},
            "collective: npu -> npu via hccl broadcast (device buckets)",
            "npu:0",
        ),
        ("npu-sim", "cpu", "auto", {"same_node": False}, "bridge: npu -> cpu via gloo broadcast", "cpu"),
        ("npu-sim", "cpu", "auto", {}, "bridge: npu -> cpu via host shared memory", "cpu"),
        ("cpu", "npu-sim", "auto", {"same_node": False}, "bridge: cpu -> npu via gloo broadcast", "npu:0"),
    ],
    ids=[
        "colocated-shm",
        "collective-hccl",
        "bridge-npu-to-cpu-cross-node",
        "bridge-npu-to-cpu-same-node",
        "bridge-cpu-to-npu-cross-node",
    ],
)
def test_simulated_npu_path(sim_workers, src, dst, forced, placement, expected, device):
    run = run_twice(sim_workers, src, dst, forced, **placement)
    assert run.plan.startswith(expected) and run.plan.endswith("[simulated device]")
    assert_synced(run, device)


def test_simulated_npu_collective_sends_large_tensors_in_place(sim_workers):
    """The hccl collective between simulated NPUs with 4 MiB buckets: tensors of 1 MiB and more go
    from the trainer's `npu:0` memory, small ones packed on the device, the largest alone."""
    assert_mixed_synced(sync_mixed_twice(sim_workers, "npu-sim", "npu-sim", "collective", True), "npu:0")
