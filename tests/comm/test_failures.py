"""Weight syncs that fail: a damaged bucket with verification on, a trainer export that breaks
mid-sync, a rollout `apply` that stops early, a version that does not increase. Each fails with
a WeightSyncError that says what happened on every end, nobody is left waiting, and the next
sync works. CPU processes, a real tiny Qwen2 at both ends."""

from __future__ import annotations

import pytest

from tests.comm.scenarios import CHECKS, close_sync, open_sync, sync
from tests.comm.workers import RemoteError


def _ok(result) -> dict:
    assert not isinstance(result, RemoteError), result
    return result


@pytest.mark.parametrize(
    ("forced", "same_node"), [("auto", True), ("collective", True)], ids=["bridge-shm", "collective-gloo"]
)
def test_checksum_mismatch_fails_the_step_and_keeps_the_old_weights(cpu_workers, forced, same_node):
    run = open_sync(cpu_workers, "cpu", "cpu", forced, same_node=same_node, verify=True)
    try:
        first, received = sync(cpu_workers, run, seed=1, version=1)
        assert all(_ok(got)["hash"] == _ok(first)["hash"] for got in received)
        failed, received = sync(cpu_workers, run, seed=2, version=2, calls={1: ("receive", (3,))})
        assert isinstance(failed, RemoteError) and failed.type_name == "WeightSyncError"
        assert (
            "weight sync of version 2 failed on 1 rollout worker(s): worker 1: WeightSyncError"
            in failed.message
        )
        damaged, intact = received
        assert isinstance(damaged, RemoteError) and damaged.type_name == "WeightSyncError"
        assert "bucket 3 of the weight sync of version 2 failed its checksum" in damaged.message
        assert "nothing was applied: this rollout worker keeps the weights of version 1" in damaged.message
        kept = cpu_workers[1].call(f"{CHECKS}:report")
        assert (kept["hash"], kept["generation"], kept["version"]) == (first["hash"], first["generation"], 1)
        assert _ok(intact)["version"] == 2
        again, received = sync(cpu_workers, run, seed=2, version=3)
        assert all(_ok(got)["hash"] == _ok(again)["hash"] and got["version"] == 3 for got in received)
        assert intact["hash"] == again["hash"], "the intact worker got version 2 right"
    finally:
        close_sync(cpu_workers)


@pytest.mark.parametrize(
    ("forced", "same_node", "verify", "state"),
    [("auto", True, False, "has been partly updated"), ("bridge", False, True, "keeps its previous weights")],
    ids=["bridge-shm", "bridge-gloo-verified"],
)
def test_a_failed_export_reaches_every_receiver(cpu_workers, forced, same_node, verify, state):
    run = open_sync(cpu_workers, "cpu", "cpu", forced, same_node=same_node, verify=verify)
    try:
        first, _ = sync(cpu_workers, run, seed=1, version=1)
        failed, received = sync(cpu_workers, run, seed=2, version=2, fail_after=5)
        assert isinstance(failed, RemoteError) and failed.type_name == "RuntimeError"
        assert "(injected by the test)" in failed.message
        for got in received:
            assert isinstance(got, RemoteError) and got.type_name == "WeightSyncError"
            assert (
                "the trainer aborted the weight sync of version 2 (RuntimeError: export failed at"
                in got.message
            )
            assert f"this rollout worker {state}" in got.message
        for worker in cpu_workers[1:]:
            after = worker.call(f"{CHECKS}:report")
            assert after["version"] == 1
            assert (after["hash"] == first["hash"]) is verify
        again, received = sync(cpu_workers, run, seed=2, version=2)
        assert all(_ok(got)["hash"] == _ok(again)["hash"] for got in received)
    finally:
        close_sync(cpu_workers)


def test_an_apply_that_stops_early_is_refused(cpu_workers):
    run = open_sync(cpu_workers, "cpu", "cpu", "collective")
    try:
        failed, (complete, partial) = sync(
            cpu_workers, run, seed=1, version=1, calls={2: ("receive_partially", ())}
        )
        assert _ok(complete)["version"] == 1
        assert isinstance(partial, RemoteError) and partial.type_name == "WeightSyncError"
        assert "the apply callable returned after 1 tensors, before the end of the sync" in partial.message
        assert (
            isinstance(failed, RemoteError)
            and "worker 2: WeightSyncError: the apply callable" in failed.message
        )
    finally:
        close_sync(cpu_workers)


def test_versions_must_increase(cpu_workers):
    run = open_sync(cpu_workers, "cpu", "cpu")
    try:
        _ok(sync(cpu_workers, run, seed=1, version=4)[0])
        with pytest.raises(RemoteError) as info:
            cpu_workers[0].call(f"{CHECKS}:send", 2, 4, None)
        assert info.value.type_name == "WeightSyncError"
        assert (
            "version 4 does not follow the last one sent (4): versions are trainer steps"
            in info.value.message
        )
    finally:
        close_sync(cpu_workers)
