"""Run a function on N local ranks: spawned processes in one torch.distributed world, met through a
file store in a fresh temporary folder (no port picked ahead and raced for), the way a hosting
worker group would start trainers (for tests, benchmarks and trying a parallel layout on one
machine).

`run_ranks("pkg.mod:function", n, *args)` calls `function(rank, *args)` in every rank after
`torch.distributed` is initialized with the backend of the rank's platform (`ROLL_DEVICE`, default
cpu here: gloo) and returns the per-rank results in rank order; a failing rank raises with its
traceback, a rank that dies without one (killed, crashed, or failed at its start) within a second
with its exit code, not at the end of `timeout`. Each rank computes with `OMP_NUM_THREADS` intra-op
threads: the caller's, or the host's cores shared out among the ranks.
"""

from __future__ import annotations

import importlib
import os
import queue as queues
import shutil
import tempfile
import time
import traceback

import torch
import torch.multiprocessing as mp


def _entry(target, rank, world_size, store, args, env, queue) -> None:
    os.environ.update(env)
    try:
        # torch (imported with this module, before `env` was set) read OMP_NUM_THREADS as it started
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        import torch.distributed as dist

        import roll_device as rd

        platform = rd.current_platform()
        if platform.device_count() > 1:
            platform.set_device(rank % platform.device_count())
        dist.init_process_group(
            platform.dist_backend, init_method=f"file://{store}", rank=rank, world_size=world_size
        )
        module, name = target.split(":")
        result = getattr(importlib.import_module(module), name)(rank, *args)
        dist.destroy_process_group()
        queue.put((rank, True, result))
    except BaseException:  # noqa: BLE001 (any failure goes back to the parent with its traceback)
        queue.put((rank, False, traceback.format_exc()))


POLL_S = 1.0  # how often the parent looks for ranks that died without a result


def _check_alive(target: str, procs: list, queue, results: dict, deadline: float, timeout: float) -> None:
    """Raise for a rank that ended without a result, or when `timeout` has passed. A rank's result
    is in the queue's pipe before its process ends: a rank seen ended while the queue is empty is
    lost."""
    ended = [r for r, p in enumerate(procs) if r not in results and p.exitcode is not None]
    if ended and queue.empty():
        codes = ", ".join(f"rank {r} with exit code {procs[r].exitcode}" for r in ended)
        raise RuntimeError(f"{target}: {codes} ended without a result (killed, or crashed; see its output)")
    if time.monotonic() > deadline:
        missing = [r for r in range(len(procs)) if r not in results]
        raise TimeoutError(f"{target}: no result from ranks {missing} within {timeout:.0f} s")


def run_ranks(
    target: str, world_size: int, *args, env: dict[str, str] | None = None, timeout: float = 180
) -> list:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    folder = tempfile.mkdtemp(prefix="roll-ranks-")
    threads = str(max(1, (os.cpu_count() or 1) // world_size))  # ranks share the host's cores
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads), **(env or {})}
    procs = [
        ctx.Process(target=_entry, args=(target, rank, world_size, f"{folder}/store", args, env, queue))
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size:
            try:
                rank, ok, value = queue.get(timeout=POLL_S)
            except queues.Empty:
                _check_alive(target, procs, queue, results, deadline, timeout)
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} of {target} failed:\n{value}")
            results[rank] = value
    finally:
        failed = len(results) < world_size  # the others may wait for the failed rank forever
        for p in procs:
            if failed:
                p.kill()
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        shutil.rmtree(folder, ignore_errors=True)
    return [results[r] for r in range(world_size)]
