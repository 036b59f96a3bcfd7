"""The shared memory of a run, found by owner (roll_device/cluster/shm.py), with real processes:
a child that creates a segment and a named semaphore and is then killed outright (as Ray kills an
actor's process tree) leaves them behind; what the watch saw them held by is removed, and
nothing held by a process outside the watched tree, or still held by one inside it, is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

from roll_device.cluster import shm

# makes a segment and a semaphore of the given names, says so, and waits to be killed
HOLDER = """
import sys, time
from multiprocessing import resource_tracker, shared_memory
import _multiprocessing
segment = shared_memory.SharedMemory(name=sys.argv[1], create=True, size=1 << 20)
resource_tracker.unregister(segment._name, "shared_memory")  # under Ray the tracker dies with the tree
semaphore = _multiprocessing.SemLock(1, 1, 1, "/" + sys.argv[2], False)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder():
    """Start a holder of fresh names; yields (process, names); kills it and removes what is left."""
    started = []

    def start(tag: str) -> tuple[subprocess.Popen, set[str]]:
        segment, semaphore = f"rd-test-{tag}-{uuid.uuid4().hex[:8]}", f"rd-test-{tag}-{uuid.uuid4().hex[:8]}"
        process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, segment, semaphore], stdout=subprocess.PIPE, text=True
        )
        started.append((process, {segment, f"sem.{semaphore}"}))
        assert process.stdout.readline().strip() == "ready"
        return started[-1]

    yield start
    for process, names in started:
        process.kill()
        process.wait()
        for name in names:
            (shm.SHM_DIR / name).unlink(missing_ok=True)


def left(names: set[str]) -> set[str]:
    return {name for name in names if (shm.SHM_DIR / name).exists()}


def test_what_a_killed_child_held_is_released_and_nothing_else(holder):
    _, theirs = holder("before")  # held before the engine started: not its own
    owned = shm.Owned()
    child, ours = holder("child")
    owned.look()
    assert ours <= owned.names and not theirs & owned.names
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert left(ours) == ours, "a killed process removes nothing itself"
    assert sorted(owned.release()) == sorted(ours)
    assert left(ours) == set() and left(theirs) == theirs


def test_a_name_still_held_inside_the_tree_is_kept(holder):
    owned = shm.Owned()
    _, ours = holder("alive")
    owned.look()
    assert owned.release() == [] and left(ours) == ours


def test_a_watch_sees_what_appears_while_it_runs(holder):
    with shm.Watch(period_s=0.05) as watch:
        _, ours = holder("watched")
        while not ours <= watch.names:
            watch._stop.wait(0.05)
    assert ours <= watch.names


def test_a_sweep_removes_what_the_ledgers_of_the_role_recorded(holder, tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "LEDGERS", tmp_path)
    child, ours = holder("ledger")
    _, theirs = holder("other-role")
    shm.write_ledger("run-a", "actor_infer")(ours)
    shm.write_ledger("run-a", "actor_train")(theirs)
    child.kill()
    child.wait()
    assert sorted(shm.sweep("run-a", "actor_infer")) == sorted(ours)
    assert left(ours) == set() and left(theirs) == theirs
    assert not (tmp_path / "run-a" / "actor_infer").exists()
    assert shm.sweep("run-a", "actor_infer") == [], "a second sweep finds nothing"
