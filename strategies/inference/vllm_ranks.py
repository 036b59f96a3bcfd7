"""Name the process of a vLLM engine that died: an engine of several ranks (tensor parallelism, the
`mp` executor) runs each rank in a child process; when one dies, the engine's call fails in the
words of whatever noticed first (its message queue: "cancelled"; gloo: "Connection closed by
peer"). `naming_dead_ranks(llm)` turns such a failure into an `EngineRankDiedError` that says which
rank died and how (its exit status, which only the engine's process, its parent, can read).

Ranks are found where the in-process engine keeps them (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, as on
the CPU); an engine core in a process of its own hides them, and its error passes unchanged.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STOPPED_BY_ENGINE = -signal.SIGTERM  # the executor's own shutdown of the ranks left alive


class EngineRankDiedError(RuntimeError):
    """A rank of the vLLM engine (a process of its own) died."""


@contextmanager
def naming_dead_ranks(llm: Any) -> Iterator[None]:
    """Run an engine call; if it fails while a rank's process is dead, raise an
    EngineRankDiedError naming the rank, its pid and how it ended instead."""
    try:
        yield
    except Exception as exc:
        dead = dead_ranks(llm)
        if not dead:
            raise
        raise EngineRankDiedError("; ".join(dead)) from exc


def dead_ranks(llm: Any) -> list[str]:
    """`vLLM rank R (pid P) died: how` for each rank process of `llm`'s engine that ended by
    itself (not by the executor's shutdown of the others)."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    workers = getattr(getattr(core, "model_executor", None), "workers", None) or []
    return [
        f"vLLM rank {handle.rank} (pid {handle.proc.pid}) died: {how_ended(handle.proc.exitcode)}"
        for handle in workers
        if handle.proc.exitcode not in (None, 0, STOPPED_BY_ENGINE)
    ]


def how_ended(exitcode: int) -> str:
    """A process's exit status in words (multiprocessing's: -N for signal N)."""
    if exitcode > 0:
        return f"it exited with status {exitcode}"
    name = signal.Signals(-exitcode).name
    if name == "SIGKILL":
        return "the process was killed (SIGKILL: `kill -9` or the out-of-memory killer)"
    return f"the process ended by {name}"
