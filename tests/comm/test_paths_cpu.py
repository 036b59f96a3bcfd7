"""Each weight-sync path between CPU processes: a real tiny Qwen2 exported by the trainer end is
loaded into the rollout ends' models; hashes, generations and versions follow the trainer."""

from __future__ import annotations

import pytest

from tests.comm.scenarios import assert_mixed_synced, assert_synced, run_twice, sync_mixed_twice


@pytest.mark.parametrize(
    ("forced", "placement", "expected"),
    [
        ("auto", {"colocated": True}, "colocated: cpu -> cpu via host shared memory"),
        ("collective", {}, "collective: cpu -> cpu via gloo broadcast"),
        ("auto", {}, "bridge: cpu -> cpu via host shared memory"),
        ("bridge", {"same_node": False}, "bridge: cpu -> cpu via gloo broadcast"),
    ],
    ids=["colocated-shm", "collective-gloo", "bridge-same-node-shm", "bridge-cross-node-gloo"],
)
def test_cpu_path(cpu_workers, forced, placement, expected):
    run = run_twice(cpu_workers, "cpu", "cpu", forced, **placement)
    assert run.plan.startswith(expected)
    assert_synced(run, "cpu")


@pytest.mark.parametrize(
    ("forced", "same_node"),
    [("bridge", False), ("collective", True), ("bridge", True)],
    ids=["bridge-gloo", "collective-gloo", "bridge-shm"],
)
def test_large_tensors_go_in_place_and_small_ones_packed(cpu_workers, forced, same_node):
    """Buckets of 4 MiB: broadcast paths send the tensors of 1 MiB and more from the trainer's own
    memory and pack the runs of small ones between them; the 4.7 MiB tensor travels alone."""
    assert_mixed_synced(sync_mixed_twice(cpu_workers, "cpu", "cpu", forced, same_node), "cpu")
