"""A step's timing, kept apart from its algorithm (roll_device/pipeline/loop.py).

`StepTimeline` times one step from its collected rollout to its policy update: the seconds of
each part by the perf counter (`rollout_s`, `reward_s`, `refill_s` for DAPO's extra rounds,
`logprob_s`, `train_s`) and each part's wall-clock span by name for the record's `timeline`
(`rollout`; `train`, which covers its parts `reward`, `refill`, `logprob` and `update`). `TurnLog` keeps the colocated turns taken since the last record
(roll_device/pipeline/lifecycle.py): each turn's span under its name (`for_rollout`,
`for_training`, `for_sync`), their seconds together (`swap_s`, part of `step_s`) and the device
bytes they freed (`freed_bytes_<role>`). The sync's own time and turn are added to the step's
record after it (`StepRecord.add_turns`, `StepRecord.add_sync`, roll_device/pipeline/record.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

# each timed part of the step's training -> its seconds' key in the record
PART_SECONDS = {"reward": "reward_s", "refill": "refill_s", "logprob": "logprob_s", "update": "train_s"}

Spans = dict[str, list[float]]  # a span's name -> its wall clock [begin, end]


@dataclass
class Timed:
    """A timed stretch: its seconds by the perf counter and its wall-clock span [begin, end]."""

    seconds: float = 0.0
    span: list[float] = field(default_factory=list)


@contextmanager
def timed() -> Iterator[Timed]:
    """Times the `with` block; the result is filled in when the block ends without an error."""
    result = Timed()
    begin, wall = time.perf_counter(), time.time()
    yield result
    result.seconds, result.span = time.perf_counter() - begin, [wall, time.time()]


def turn_seconds(spans: Spans) -> float:
    """The seconds of the turns in `spans` together."""
    return sum(end - begin for begin, end in spans.values())


class TurnLog:
    """The colocated turns taken since a record last took them: each turn's wall-clock span under
    the turn's name, and the device bytes the turns freed (`freed_bytes_<role>`)."""

    def __init__(self) -> None:
        self.spans: Spans = {}
        self.freed: dict[str, int] = {}

    def take(self, turn: Callable[[], dict[str, int] | None]) -> None:
        """Takes one turn (`ColocatedTurns.for_*`) and logs it."""
        with timed() as took:
            self.freed.update(turn() or {})
        self.spans[turn.__name__] = took.span

    def pop_spans(self) -> Spans:
        spans, self.spans = self.spans, {}
        return spans

    def pop_freed(self) -> dict[str, int]:
        freed, self.freed = self.freed, {}
        return freed


class StepTimeline:
    """One step's timing from its collected rollout (generated over `rollout_span`, waited for
    `waited_s`) to its policy update, with the turns taken for it up to the update (`turns`,
    emptied by `fields`)."""

    def __init__(self, rollout_span: list[float], waited_s: float, turns: TurnLog) -> None:
        self.start, self.started = time.perf_counter(), time.time()
        self.rollout_span = rollout_span
        self.waited_s = waited_s  # the driver's wait for the rollout: part of the step
        self.seconds = {"rollout_s": rollout_span[1] - rollout_span[0]}
        self.parts: Spans = {}
        self.turn_log = turns  # the turns taken up to the update are the step's (popped by `fields`)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Times the `with` block as the step's part `name` (a key of PART_SECONDS)."""
        with timed() as took:
            yield
        self.seconds[PART_SECONDS[name]] = took.seconds
        self.parts[name] = took.span

    def fields(self) -> dict:
        """The record's timing fields, in its order; the step's `train` span ends now. `sync_s`
        is 0 until the sync adds its own."""
        turns, freed = self.turn_log.pop_spans(), self.turn_log.pop_freed()
        swap_s = turn_seconds(turns)
        # a turn taken inside the train span (the trainer's reload after the reward) is already in
        # its seconds; only those before it (the engine's wake for the rollout) are added
        before = turn_seconds({name: span for name, span in turns.items() if span[1] <= self.started})
        return {
            **self.seconds,
            **freed,
            "sync_s": 0.0,
            "swap_s": swap_s,
            "step_s": time.perf_counter() - self.start + self.waited_s + before,
            "timeline": {
                "rollout": self.rollout_span,
                "train": [self.started, time.time()],
                **self.parts,
                **turns,
            },
        }
