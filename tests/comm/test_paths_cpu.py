"""Each weight-sync path between CPU processes: a real tiny Qwen2 exported by the trainer end is
loaded into the rollout ends' models; hashes, generations and versions follow the trainer."""

from __future__ import annotations

import pytest

from tests.comm.scenarios import assert_synced, run_twice


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
