"""Plain worker processes for weight-sync tests: each is a spawned Python process that runs
functions by name (`module:function`) and keeps module state between calls, so a sender and its
receivers can live in separate processes across several syncs.

A call that raises comes back as a `RemoteError` carrying the exception's type name and message.
Each worker runs torch with one intra-op thread: several of them share this machine's two cores.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import traceback
from typing import Any


class RemoteError(Exception):
    def __init__(self, type_name: str, message: str, trace: str) -> None:
        super().__init__(f"{type_name}: {message}\n{trace}")
        self.type_name, self.message = type_name, message


def _serve(conn) -> None:
    import torch

    torch.set_num_threads(1)  # several workers share two cores: no intra-op thread contention
    while True:
        request = conn.recv()
        if request is None:
            return
        target, args = request
        module, function = target.split(":")
        try:
            value = getattr(importlib.import_module(module), function)(*args)
            conn.send((True, value))
        except Exception as exc:  # noqa: BLE001  (relayed to the caller, assertion failures included)
            conn.send((False, (type(exc).__name__, str(exc), traceback.format_exc())))


class Worker:
    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        self._stopping = False

    def submit(self, target: str, *args: Any) -> None:
        self._conn.send((target, args))

    def result(self, timeout: float = 180) -> Any:
        if not self._conn.poll(timeout):
            raise TimeoutError(f"worker {self.process.pid} gave no answer within {timeout}s")
        ok, value = self._conn.recv()
        if not ok:
            raise RemoteError(*value)
        return value

    def call(self, target: str, *args: Any, timeout: float = 180) -> Any:
        self.submit(target, *args)
        return self.result(timeout)

    def close(self) -> None:
        self.stop()
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    def stop(self) -> None:
        """Ask the worker to end, once (`close` waits for it)."""
        if not self._stopping and self.process.is_alive():
            self._conn.send(None)
        self._stopping = True


def close_all(workers: list[Worker]) -> None:
    """Close `workers`, which end at the same time (a process's exit takes seconds with torch)."""
    for worker in workers:
        worker.stop()
    for worker in workers:
        worker.close()


def together(calls: list[tuple[Worker, str, tuple]], timeout: float = 180) -> list[Any]:
    """Start every call, then collect every result in order (a RemoteError in place of a failed
    call's result): for steps that both ends of a sync take at once."""
    for worker, target, args in calls:
        worker.submit(target, *args)
    results = []
    for worker, _target, _args in calls:
        try:
            results.append(worker.result(timeout))
        except RemoteError as exc:
            results.append(exc)
    return results
