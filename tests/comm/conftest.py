"""Worker processes shared by the weight-sync tests: one trainer end and two rollout ends each for
the CPU (never simulated) and for scenarios that involve the simulated NPU."""

from __future__ import annotations

import pytest

from tests.comm.workers import Worker


def _pool(size: int):
    workers = [Worker() for _ in range(size)]
    try:
        yield workers
    finally:
        for worker in workers:
            worker.close()


@pytest.fixture(scope="session")
def cpu_workers():
    yield from _pool(3)


@pytest.fixture(scope="session")
def sim_workers():
    yield from _pool(3)
