"""Where the multi-turn driver (roll_device/pipeline/agentic_step.py `TurnDriver`) sends its
requests: `EngineRequests`, one engine in this process (tests, benchmarks), and `RequestPool`,
the `actor_infer` workers through Ray. Both take requests (`submit`, non-blocking) and hand back
the finished ones (`finished`: waits until at least one has finished while any is in flight).

`RequestPool` sends each request to a worker with no `finished_requests` call outstanding (an
actor runs its calls in order, so a request sent behind a waiting call would wait with it), the
least loaded first; it waits on every worker's outstanding call at once (`ray.wait`) and re-asks
a worker as soon as its answer is in. It keeps what a step's record needs: when the first request
went out and the last came back, the engines' idle time. Its waits are its own (none of
`RoleGroups`' watch state), so it runs in the rollout thread too (roll_device/pipeline/rollout_thread.py).
"""

from __future__ import annotations

import time
from typing import Any

import ray

from roll_device.pipeline.roles import WAIT_SLICE_S, RoleGroups, watching
from roll_device.pipeline.workers import RolloutWorker
from strategies.base import InferenceStrategy, Request, Served

POLL_S = 1.0  # longest a worker's `finished_requests` waits for a request to finish


class EngineRequests:
    """The request path of one engine in this process."""

    def __init__(self, engine: InferenceStrategy) -> None:
        self.engine = engine

    def submit(self, requests: list[Request]) -> None:
        self.engine.submit(requests)

    def finished(self) -> list[Served]:
        return self.engine.finished(POLL_S)


class RequestPool:
    """The `actor_infer` workers' request path (see the module docstring)."""

    def __init__(self, roles: RoleGroups, role: str = "actor_infer") -> None:
        self.roles, self.role = roles, role
        self.group = roles.groups[role]
        self.pending = [0] * self.group.world_size  # requests out, per worker
        self.polls: dict[Any, int] = {}  # outstanding `finished_requests` call -> worker
        self.submits: dict[Any, int] = {}  # `submit_requests` calls not yet read -> worker
        self.started: float | None = None
        self.ended = 0.0
        self.waited_s = 0.0
        self.idle_s = 0.0

    def submit(self, requests: list[Request]) -> None:
        shares: dict[int, list[Request]] = {}
        for request in requests:
            worker = self._free_worker()
            shares.setdefault(worker, []).append(request)
            self.pending[worker] += 1
        for worker, share in shares.items():
            self.submits[self.group.async_call_rank(worker, RolloutWorker.submit_requests, share)] = worker
        self.started = time.time() if self.started is None else self.started

    def finished(self) -> list[Served]:
        for worker, count in enumerate(self.pending):
            if count and worker not in self.polls.values():
                self.polls[self.group.async_call_rank(worker, RolloutWorker.finished_requests, POLL_S)] = (
                    worker
                )
        start = time.perf_counter()
        ready, _ = ray.wait([*self.polls, *self.submits], num_returns=1, timeout=WAIT_SLICE_S)
        self.waited_s += time.perf_counter() - start
        self._read_submits(list(self.submits))
        served = []
        for ref in (r for r in ready if r in self.polls):
            worker = self.polls.pop(ref)
            with watching(self.role, worker):
                got = ray.get(ref)
            self.pending[worker] -= len(got)
            served += got
        self.ended = time.time() if served else self.ended
        return served

    def close(self) -> None:
        """Read every submission's answer (raising a refusal among them)."""
        self._read_submits(list(self.submits), wait=True)

    def _read_submits(self, refs: list, wait: bool = False) -> None:
        """The answers of the submissions among `refs` that are in (all of them with `wait`): a
        refusal raised here; the engines' idle time kept."""
        refs = [ref for ref in refs if ref in self.submits]
        if refs and not wait:
            refs, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in refs:
            worker = self.submits.pop(ref)
            with watching(self.role, worker):
                idle = ray.get(ref)
            self.idle_s = max(self.idle_s, idle or 0.0)

    def _free_worker(self) -> int:
        """The least loaded worker with no `finished_requests` call outstanding (the least loaded
        of all when every worker has one)."""
        busy = set(self.polls.values())
        free = [w for w in range(len(self.pending)) if w not in busy] or list(range(len(self.pending)))
        return min(free, key=lambda w: self.pending[w])
