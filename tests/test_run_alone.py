"""tests/run_alone.py: under xdist a test marked `alone` runs with no other test beside it, and
one waiting for its turn is not passed over by tests that start after it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.run_alone import held_slot

WAIT_S = 0.5  # how long a test here watches for a slot it must not get


class Holder(threading.Thread):
    """Holds a slot from `start()` until `leave()`; `entered` is set once it holds it."""

    def __init__(self, alone: bool, directory: Path) -> None:
        super().__init__(daemon=True)
        self.alone = alone
        self.directory = directory
        self.entered = threading.Event()
        self._leave = threading.Event()

    def run(self) -> None:
        with held_slot(self.alone, self.directory):
            self.entered.set()
            self._leave.wait()

    def leave(self) -> None:
        self._leave.set()
        self.join(timeout=10)


@pytest.fixture
def xdist_run(tmp_path):
    """Starts holders of slots in one shared folder, as the workers of one run."""
    holders: list[Holder] = []

    def start(alone: bool) -> Holder:
        holder = Holder(alone, tmp_path)
        holders.append(holder)
        holder.start()
        return holder

    yield start
    for holder in holders:
        holder.leave()


def test_tests_not_alone_run_side_by_side(xdist_run: Callable[[bool], Holder]):
    first, second = xdist_run(False), xdist_run(False)
    assert first.entered.wait(10) and second.entered.wait(10)


def test_an_alone_test_waits_for_the_running_one_and_then_holds_off_the_rest(xdist_run):
    running = xdist_run(False)
    assert running.entered.wait(10)
    alone = xdist_run(True)
    assert not alone.entered.wait(WAIT_S), "the alone test started beside a running test"
    later = xdist_run(False)
    assert not later.entered.wait(WAIT_S), "a later test passed the waiting alone test"
    running.leave()
    assert alone.entered.wait(10)
    assert not later.entered.wait(WAIT_S), "a test started beside the alone test"
    alone.leave()
    assert later.entered.wait(10)
