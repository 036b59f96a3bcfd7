"""A step's optimizer steps on its batch, for the policy and the critic alike: `algorithm.ppo_epochs`
passes over the batch, each cut into `algorithm.mini_batches` contiguous mini-batches with one
optimizer step apiece (PPO's K epochs of minibatch SGD, arXiv 1707.06347, Algorithm 1; verl's
`ppo_mini_batch_size` is the batch over that count). Every mini-batch's loss is aggregated over its
own tokens. A pass's first step is on-policy (ratio 1); the later ones see the ratio move away
from 1, and the loss's clip bounds it.

A mini-batch's rows are a multiple of the trainer's data-parallel size (every rank trains as many
rows, so every rank takes as many micro-batches): a batch with fewer rows than `mini_batches` x
that size (DAPO's dynamic sampling keeps fewer groups) is cut into fewer mini-batches.

The step's record takes each metric's mean over the step's updates (as verl reports them), the
learning rate of the last one, and how many there were (`updates`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from strategies.base import TrainBatch

LAST_ONLY = ("lr",)  # metrics recorded as the last update's, not the mean: the learning rate


def mini_batches(batch: TrainBatch, count: int, data_parallel_size: int) -> list[TrainBatch]:
    """`batch` cut into at most `count` contiguous parts, each a multiple of `data_parallel_size`
    rows (its rows are), their sizes differing by at most `data_parallel_size`."""
    units = len(batch) // data_parallel_size
    parts = max(1, min(count, units))
    bounds = [data_parallel_size * (units * i // parts) for i in range(parts)] + [len(batch)]
    return [batch.select(slice(bounds[i], bounds[i + 1])) for i in range(parts)]


def mean_metrics(updates: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over `updates` (the keys the first one has); `LAST_ONLY`'s are the last's."""
    means = {
        key: updates[-1][key] if key in LAST_ONLY else math.fsum(u[key] for u in updates) / len(updates)
        for key in updates[0]
    }
    return {**means, "updates": len(updates)}


class Updates:
    """The optimizer steps of one role in a step; `applied` counts those done, also after one
    failed (a refused update leaves the role at the step before it)."""

    def __init__(self, epochs: int, count: int, data_parallel_size: int) -> None:
        self.epochs, self.count, self.data_parallel_size = epochs, count, data_parallel_size
        self.applied = 0

    def run(self, update: Callable[[TrainBatch], dict[str, float]], batch: TrainBatch) -> dict[str, float]:
        """`update` on each mini-batch of each pass, in order; the metrics as `mean_metrics` has them."""
        done = []
        parts = mini_batches(batch, self.count, self.data_parallel_size)
        for _ in range(self.epochs):
            for part in parts:
                done.append(update(part))
                self.applied += 1
        return mean_metrics(done)
