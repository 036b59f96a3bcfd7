"""`RolloutThread`: the run's multi-turn rollouts advancing in the background, so that with
`algorithm.max_staleness` >= 1 a launched rollout runs while the trainer trains (as a single-turn
rollout's Ray calls do; roll_device/pipeline/overlap.py).

One daemon thread for the run runs the launched rollouts one after another, in launch order (the
order the trainer takes them): a rollout's requests are all back before the next one's go out, so
a rollout's `finished` calls never meet another's requests. `launch` queues a rollout and returns
at once; `result` waits for it in short slices (Ctrl-C and SIGTERM stay prompt in the main thread)
and raises what it raised in the thread; `drop` halts one (no more turns are submitted; the turns
in flight are drained, its environments closed) and nobody waits for it; `close`, at the run's
end, halts them all. A rollout that raised also reports its error through `on_failure` at once
(`RoleGroups.fail_in_background`: the main thread's next wait raises it), so a lost worker or
`agentic.on_env_fault=run` ends the run in seconds, not at the next collect.

What runs in the thread touches none of `RoleGroups`' watch state (its waits are its own:
`RoleGroups.wait_alone`); the main thread's waits and the thread's Ray calls are independent.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from roll_device.errors import RollDeviceError

SLICE_S = 1.0  # how long `result` waits between checks (where Ctrl-C is raised)
JOIN_S = 2.0  # how long `close` lets the thread drain the rollout it runs (a daemon: not longer)


@dataclass
class InFlight:
    """A rollout launched on the thread: `run(halt)` makes it (`halt` set: submit no more turns)."""

    run: Callable[[threading.Event], Any] = field(repr=False)
    halt: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None


class RolloutThread:
    """The run's rollout thread (see the module docstring); `on_failure` gets a rollout's error
    at once, in the thread."""

    def __init__(self, on_failure: Callable[[RollDeviceError], None], name: str = "roll-device-rollouts"):
        self.on_failure = on_failure
        self.queue: deque[InFlight] = deque()
        self.ready = threading.Condition()
        self.closed = False
        self.current: InFlight | None = None  # the rollout the thread is making
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def launch(self, run: Callable[[threading.Event], Any]) -> InFlight:
        rollout = InFlight(run)
        with self.ready:
            self.queue.append(rollout)
            self.ready.notify()
        return rollout

    def result(self, rollout: InFlight) -> Any:
        """`rollout`'s value once made; what it raised is raised here."""
        while not rollout.done.wait(SLICE_S):
            if not self.thread.is_alive():
                raise RuntimeError("the rollout thread ended before the rollout was made")
        if rollout.error is not None:
            raise rollout.error
        return rollout.value

    @staticmethod
    def drop(rollout: InFlight) -> None:
        rollout.halt.set()

    def close(self) -> None:
        """Halt every rollout and end the thread (waiting `JOIN_S` at most: it is a daemon)."""
        with self.ready:
            self.closed = True
            for rollout in [*self.queue, self.current]:
                if rollout is not None:
                    rollout.halt.set()
            self.ready.notify()
        self.thread.join(JOIN_S)

    def _serve(self) -> None:
        while (rollout := self._next()) is not None:
            try:
                if not rollout.halt.is_set():  # dropped before it began: nothing to make
                    rollout.value = rollout.run(rollout.halt)
            except BaseException as exc:  # noqa: BLE001 (raised in the main thread by `result`)
                rollout.error = exc
                if isinstance(exc, RollDeviceError) and not rollout.halt.is_set():
                    self.on_failure(exc)
            rollout.done.set()
            self.current = None

    def _next(self) -> InFlight | None:
        with self.ready:
            self.ready.wait_for(lambda: self.queue or self.closed)
            if not self.queue:
                return None
            self.current = self.queue.popleft()
            if self.closed:
                self.current.halt.set()
            return self.current
