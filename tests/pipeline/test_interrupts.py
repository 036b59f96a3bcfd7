"""SIGTERM and Ctrl-C told apart (roll_device/pipeline/interrupts.py), wherever the interrupt is
caught and raised again on its way to the run's handler: a SIGTERM is reported as SIGTERM, with
exit 143, at every stage."""

import os
import signal

import pytest

from roll_device.pipeline.interrupts import (
    RunInterruptedError,
    RunTerminatedError,
    how_stopped,
    sigterm_as_interrupt,
)


def _caught_and_raised_again() -> KeyboardInterrupt:
    """SIGTERM to this process while code that turns any interrupt into a plain KeyboardInterrupt
    (as a library's wait may) runs; the interrupt that comes out."""
    with sigterm_as_interrupt():
        try:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                signal.pause()  # delivered before pause returns
            except KeyboardInterrupt:
                raise KeyboardInterrupt from None
        except KeyboardInterrupt as stop:
            return stop
    pytest.fail("SIGTERM raised nothing")


def test_a_sigterm_raised_again_as_a_plain_interrupt_is_still_sigterm():
    stop = _caught_and_raised_again()
    assert type(stop) is KeyboardInterrupt
    error, what = how_stopped(stop)
    assert (error, what, error.exit_code) == (RunTerminatedError, "terminated (SIGTERM)", 143)


def test_ctrl_c_is_ctrl_c_after_an_earlier_run_got_sigterm():
    _caught_and_raised_again()
    with sigterm_as_interrupt():  # a new run (the same process: the tests, an API user)
        error, what = how_stopped(KeyboardInterrupt())
    assert (error, what, error.exit_code) == (RunInterruptedError, "interrupted (Ctrl-C)", 130)
