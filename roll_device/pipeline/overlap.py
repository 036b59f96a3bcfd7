"""Which rollouts run when: `algorithm.max_staleness` (k) bounds how far the rollout runs ahead.

The rollout trained at trainer step t (the batch that makes step t + 1) may come from the weights
of any step v with t - v <= k. `RolloutQueue.fill()` launches every rollout that bound allows,
given the version the engines will hold when they reach it (`synced(v)` after each weight sync:
a worker runs its calls in order, so a generation launched after a sync computes with its
weights); `take(t)` hands over rollout t, and `admit` keeps a rollout whose engines reported a
version beyond the bound from ever being trained on (it and those launched after it are dropped
and launched again from the current weights).

k = 0 is the synchronous loop: rollout t is launched only once the engines hold step t's weights.
k = 1: rollout t + 1 is launched right after the sync of step t's weights and runs while step t is
scored and trained; its sync then waits for the engines to finish it (weights change between
engine batches).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Rollout:
    """Rollout `step` (trained at trainer step `step`), launched on the engines: the prompts at data
    position `position`, the calls in flight (`pending`: what `launch` returned), and the weight
    version it was launched to be generated with."""

    step: int
    position: int
    size: int  # prompts
    version: int
    pending: Any = field(repr=False)


Launch = Callable[[int, int, int], Rollout]  # (step, data position, weight version) -> launched


class RolloutQueue:
    def __init__(
        self, max_staleness: int, last_step: int, launch: Launch, drop: Callable[[Rollout], None]
    ) -> None:
        """`launch` starts a rollout; `drop` lets go of one that will not be trained on."""
        self.max_staleness, self.last_step = max_staleness, last_step
        self.launch, self.drop = launch, drop
        self.queued: deque[Rollout] = deque()
        self.next_step = self.next_position = self.engine_version = 0

    def start(self, step: int, position: int, engine_version: int) -> None:
        """Begin at trainer step `step`, data position `position`, the engines holding `engine_version`."""
        self.queued.clear()
        self.next_step, self.next_position, self.engine_version = step, position, engine_version

    def allowed(self, step: int) -> bool:
        """Whether rollout `step` may be launched now (from the engines' next weights)."""
        return step < self.last_step and step - self.engine_version <= self.max_staleness

    def fill(self) -> None:
        while self.allowed(self.next_step):
            rollout = self.launch(self.next_step, self.next_position, self.engine_version)
            self.queued.append(rollout)
            self.next_step += 1
            self.next_position += rollout.size

    def took_prompts_to(self, position: int) -> None:
        """The step trained on the prompts up to data `position` (beyond its rollout's: DAPO's
        extra rounds, which only a synchronous loop samples, with nothing queued): the next
        rollout starts there."""
        if not self.queued:
            self.next_position = max(self.next_position, position)

    def synced(self, version: int) -> None:
        """The engines hold (or, in call order, will hold) the weights of step `version`."""
        self.engine_version = version

    def take(self, step: int) -> Rollout:
        """Rollout `step`, launched now if it was not yet."""
        if not self.queued:
            self.fill()
        rollout = self.queued.popleft()
        if rollout.step != step:
            raise RuntimeError(
                f"rollout {rollout.step} came up for trainer step {step}: launched out of order"
            )
        return rollout

    def admit(self, rollout: Rollout, generated_version: int) -> bool:
        """Whether rollout `rollout`, generated with the weights of step `generated_version`, may be
        trained on (within `max_staleness` of its step); if not, it and every rollout launched after
        it are dropped, to be launched again from the engines' current weights."""
        if rollout.step - generated_version <= self.max_staleness:
            return True
        for later in self.queued:
            self.drop(later)
        self.queued.clear()
        self.next_step, self.next_position = rollout.step, rollout.position
        return False
