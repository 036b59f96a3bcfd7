"""tests/run_alone.py: under xdist tests run side by side, a test's `alone()` block waits for the
tests running on the other workers and holds off the ones they start next, those tests go on
once the block ends (while its test still runs), and two tests asking at once both get their turn.
Each `Holder` here plays one worker's running test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.run_alone import held_slot

WAIT_S = 0.5  # how long a test here watches for something that must not happen


class Holder(threading.Thread):
    """Holds a slot from `start()` until `leave()`; between, `ask_alone()` enters an `alone()`
    block until `end_alone()`. `entered` / `alone_entered` are set once it holds each."""

    def __init__(self, directory: Path) -> None:
        super().__init__(daemon=True)
        self.directory = directory
        self.entered = threading.Event()
        self.alone_entered = threading.Event()
        self._ask_alone = threading.Event()
        self._end_alone = threading.Event()
        self._leave = threading.Event()

    def run(self) -> None:
        with held_slot(self.directory) as slot:
            self.entered.set()
            while not self._leave.wait(0.01):
                if self._ask_alone.is_set():
                    with slot.alone():
                        self.alone_entered.set()
                        self._end_alone.wait()
                    self._ask_alone.clear()

    def ask_alone(self) -> None:
        self._ask_alone.set()

    def end_alone(self) -> None:
        self._end_alone.set()

    def leave(self) -> None:
        self._end_alone.set()
        self._leave.set()
        self.join(timeout=10)


@pytest.fixture
def xdist_run(tmp_path):
    """Starts holders of slots in one shared folder, as the workers of one run."""
    holders: list[Holder] = []

    def start() -> Holder:
        holder = Holder(tmp_path)
        holders.append(holder)
        holder.start()
        return holder

    yield start
    for holder in holders:
        holder.leave()


def test_tests_run_side_by_side(xdist_run: Callable[[], Holder]):
    first, second = xdist_run(), xdist_run()
    assert first.entered.wait(10) and second.entered.wait(10)


def test_an_alone_block_waits_for_the_other_test_holds_off_later_ones_then_lets_them_beside(xdist_run):
    running, asking = xdist_run(), xdist_run()
    assert running.entered.wait(10) and asking.entered.wait(10)
    asking.ask_alone()
    assert not asking.alone_entered.wait(WAIT_S), "the block began beside a running test"
    later = xdist_run()
    assert not later.entered.wait(WAIT_S), "a later test passed the waiting block"
    running.leave()
    assert asking.alone_entered.wait(10)
    assert not later.entered.wait(WAIT_S), "a test started beside the block"
    asking.end_alone()
    assert later.entered.wait(10), "the test after the block did not start beside the rest of its test"


def test_two_blocks_asked_at_once_both_run(xdist_run):
    first, second = xdist_run(), xdist_run()
    assert first.entered.wait(10) and second.entered.wait(10)
    first.ask_alone()
    second.ask_alone()
    deadline = time.monotonic() + 10
    while not (first.alone_entered.is_set() or second.alone_entered.is_set()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first.alone_entered.is_set() or second.alone_entered.is_set(), "neither block began"
    winner, waiter = (first, second) if first.alone_entered.is_set() else (second, first)
    assert not waiter.alone_entered.wait(WAIT_S), "two blocks at once"
    winner.end_alone()
    assert not waiter.alone_entered.wait(WAIT_S), "the block began beside the winner's running test"
    winner.leave()
    assert waiter.alone_entered.wait(10)
