"""roll_device/pipeline/rollout_thread.py: rollouts made in the background in launch order, what
one raised raised at `result` (and reported at once), a dropped one halted, `close` ending the
thread with a rollout still running."""

from __future__ import annotations

import threading

import pytest

from roll_device.agentic.environment import EnvironmentFaultError
from roll_device.pipeline.rollout_thread import RolloutThread


def test_rollouts_are_made_in_launch_order_and_their_errors_reach_the_caller():
    failures, order = [], []
    rollouts = RolloutThread(failures.append)
    first = rollouts.launch(lambda halt: order.append(1) or "first")
    second = rollouts.launch(lambda halt: order.append(2) or "second")

    def fault(halt):
        raise EnvironmentFaultError("environment failed; agentic.on_env_fault=run ends the run")

    third = rollouts.launch(fault)
    assert (rollouts.result(second), rollouts.result(first)) == ("second", "first")
    assert order == [1, 2]
    with pytest.raises(EnvironmentFaultError, match="ends the run"):
        rollouts.result(third)
    assert [type(f) for f in failures] == [EnvironmentFaultError], "reported at once, for the next wait"
    rollouts.close()
    assert not rollouts.thread.is_alive()


def test_a_dropped_rollout_is_halted_and_close_halts_the_one_running():
    rollouts = RolloutThread(lambda failed: None)
    started = threading.Event()

    def until_halted(halt):
        started.set()
        assert halt.wait(10)
        return "halted"

    running = rollouts.launch(until_halted)
    queued = rollouts.launch(lambda halt: "made")
    started.wait(10)
    rollouts.drop(queued)  # dropped before it began: never made
    rollouts.close()
    assert rollouts.result(running) == "halted" and rollouts.result(queued) is None
    assert not rollouts.thread.is_alive()
