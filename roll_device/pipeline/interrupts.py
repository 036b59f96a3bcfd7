"""A run stopped from outside: Ctrl-C (SIGINT, Python's KeyboardInterrupt) or SIGTERM (what
schedulers, `kill` and `ray job stop` send) are handled alike. `sigterm_as_interrupt()` makes
SIGTERM raise `Terminated`, a KeyboardInterrupt, in the main thread, so every handler of Ctrl-C
(the run's checkpoint of its last finished step, the message that says how to resume) serves both.

The exit status follows the shell's rule, 128 + the signal's number: 130 after Ctrl-C
(`RunInterruptedError`), 143 after SIGTERM (`RunTerminatedError`), what a batch scheduler or a
shell reports for a job its signal ended.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from roll_device.errors import RollDeviceError


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt."""


class RunInterruptedError(RollDeviceError):
    """The user stopped the run (Ctrl-C); the message says what was kept and how to go on."""

    exit_code = 130


class RunTerminatedError(RunInterruptedError):
    """The run got SIGTERM; the message says what was kept and how to go on."""

    exit_code = 143


# Whether SIGTERM arrived inside `sigterm_as_interrupt`: code between the handler and the run's
# `except` (Ray's waits, a worker group's set-up) may catch the `Terminated` and raise a plain
# KeyboardInterrupt in its place, so the signal is remembered, not read from the exception alone.
_sigterm_received = threading.Event()


def how_stopped(interrupt: KeyboardInterrupt) -> tuple[type[RunInterruptedError], str]:
    """The error that reports a run ended by `interrupt`, and how to say what happened."""
    if isinstance(interrupt, Terminated) or _sigterm_received.is_set():
        return RunTerminatedError, "terminated (SIGTERM)"
    return RunInterruptedError, "interrupted (Ctrl-C)"


def _raise_terminated(signum: int, frame: object) -> None:
    _sigterm_received.set()
    raise Terminated


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises `Terminated` inside the block (in the main thread; elsewhere signals are
    not Python's to handle), the handler before it is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _sigterm_received.clear()
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
