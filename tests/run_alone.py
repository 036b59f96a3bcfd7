"""Tests marked `alone` run with no other test beside them when pytest-xdist spreads the suite
over several workers (the README's `-n 2`); without xdist this does nothing.

Which tests: those that start a simulated cluster of several Ray nodes. Ray gives each node's
raylet a fixed 30 s to register with the cluster (ray/_private/node.py, not configurable); the
nodes of a simulated cluster start together, and on two cores shared with another worker's test
one of them can miss it (seen once in a `-n 2` run: "The current node timed out during startup").

How: every test holds a shared lock on one file in the run's shared temp folder, and a test
marked `alone` holds it exclusively. Each first passes a turnstile lock, which a waiting `alone`
test holds, so tests that keep starting beside each other cannot pass it over.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

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


@contextlib.contextmanager
def held_slot(alone: bool, directory: Path | None) -> Iterator[None]:
    """Hold this worker's place in the run while one test runs (its set-up and teardown too);
    `directory`: the workers' shared folder, None when no test runs beside another."""
    if directory is None:
        yield
        return
    with contextlib.ExitStack() as held:
        with _locked(directory / "run-alone.turnstile", fcntl.LOCK_EX):
            mode = fcntl.LOCK_EX if alone else fcntl.LOCK_SH
            held.enter_context(_locked(directory / "run-alone.slots", mode))
        yield
