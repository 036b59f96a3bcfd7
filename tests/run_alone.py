"""Under pytest-xdist (the README's `-n 2`), the nodes of a simulated cluster start with no other
test running beside them; without xdist this does nothing.

Why: Ray gives each node's raylet a fixed 30 s to register with the cluster (ray/_private/node.py,
not configurable); the nodes of a simulated cluster start together, and on two cores shared with
another worker's test one of them can miss it (seen once in a `-n 2` run: "The current node timed
out during startup"). Only the start needs the machine: once the nodes are registered, the test
goes on beside the others (conftest.py wraps `SimNodes.add_nodes` in `alone()`).

How: every test holds a shared lock on one file in the run's shared temp folder (`held_slot`);
`alone()` turns this test's lock exclusive for its block, so it waits for the tests running on the
other workers to end, and turns it back shared after. Every test first passes a turnstile lock,
which a waiting `alone()` holds, so tests that keep starting on the other workers cannot pass it
over.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest


@contextlib.contextmanager
def _locked(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a") as handle:  # closing the file releases the lock
        fcntl.flock(handle, mode)
        yield


def shared_dir(config: pytest.Config) -> Path | None:
    """The temp folder the workers of an xdist run share (each has its own `--basetemp` in it,
    and pytest prunes it as it does its other temp folders); None outside xdist."""
    if not hasattr(config, "workerinput"):
        return None
    return Path(config.option.basetemp).parent


class Slot:
    """One worker's place in the run while one of its tests runs: a shared lock on the slots file."""

    def __init__(self, slots: IO) -> None:
        self._slots = slots
        self._turnstile = Path(slots.name).with_name("run-alone.turnstile")

    def enter(self) -> None:
        with _locked(self._turnstile, fcntl.LOCK_EX):
            fcntl.flock(self._slots, fcntl.LOCK_SH)

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """Run the block with no test running on another worker: wait for theirs to end (holding
        off the ones they would start next), then let them go on when the block ends."""
        fcntl.flock(self._slots, fcntl.LOCK_UN)  # held while waiting, it could hold up another alone()
        with _locked(self._turnstile, fcntl.LOCK_EX):
            fcntl.flock(self._slots, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._slots, fcntl.LOCK_SH)  # still behind the turnstile: no one cuts in


_held: Slot | None = None  # the slot of the test this worker runs


@contextlib.contextmanager
def held_slot(directory: Path | None) -> Iterator[Slot | None]:
    """Hold this worker's place in the run while one test runs (its set-up and teardown too);
    `directory`: the workers' shared folder, None when no test runs beside another."""
    global _held
    if directory is None:
        yield None
        return
    with open(directory / "run-alone.slots", "a") as slots:  # closing the file releases the lock
        slot = Slot(slots)
        slot.enter()
        _held = slot
        try:
            yield slot
        finally:
            _held = None


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """The running test's `Slot.alone()`; outside xdist, nothing."""
    if _held is None:
        yield
        return
    with _held.alone():
        yield
