"""Worker processes shared by the weight-sync tests: one trainer end and two rollout ends each for
the CPU (never simulated) and for scenarios that involve the simulated NPU; and a local Ray
instance that declares two NPUs, with the NPU's direct transport registered before any actor
starts (the Ray Compiled Graph and direct-transport tests)."""

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


@pytest.fixture(scope="session")
def ray_npus():
    """A local Ray instance with two (simulated) NPUs; yields the NPU's direct-transport name."""
    import ray

    from roll_device.comm.ray_graphs.transport import register_direct_transport

    ray.init(address="local", num_cpus=4, resources={"NPU": 2}, include_dashboard=False, log_to_driver=False)
    try:
        yield register_direct_transport("npu")
    finally:
        ray.shutdown()
