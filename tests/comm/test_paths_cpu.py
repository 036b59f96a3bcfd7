"""Each weight-sync path between CPU processes: a real tiny Qwen2 exported by the trainer end is
loaded into the rollout ends' models; hashes, generations and versions follow the trainer."""

from __future__ import annotations

import pytest

from tests.comm.scenarios import CHECKS, assert_synced, close_sync, open_sync, run_twice
from tests.comm.workers import RemoteError, together


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
    open_sync(cpu_workers, "cpu", "cpu", forced, same_node=same_node, bucket_bytes=4 << 20)
    try:
        for version, seed in ((1, 1), (2, 2)):
            export, *received = together(
                [(cpu_workers[0], f"{CHECKS}:send_mixed", (seed, version))]
                + [(r, f"{CHECKS}:receive_copies", ()) for r in cpu_workers[1:]]
            )
            assert not isinstance(export, RemoteError), export
            assert (export["stats"].buckets, export["stats"].tensors) == (3, 6)
            for got in received:
                assert not isinstance(got, RemoteError), got
                assert got["hash"] == export["hash"] and got["devices"] == ["cpu"]
    finally:
        close_sync(cpu_workers)
