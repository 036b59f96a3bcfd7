"""Fixtures of the pipeline's run tests: one embedded Ray for a failed run and its resumption."""

import pytest
import ray


@pytest.fixture
def shared_ray():
    """One embedded Ray for the failed run and its resumption."""
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()
