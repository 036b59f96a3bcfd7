"""Prompt sources: where each step's prompts (and their reference answers) come from.

A source maps a data position (prompts consumed so far) to prompts deterministically, so the
position is all a checkpoint needs to continue the same stream. `TaskPrompts` generates a toy
task's prompts; `DatasetPrompts` walks a file's records in a seeded order that is reshuffled
every epoch (epoch e is position // records), holding out evaluation samples that training never
sees.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from roll_device.errors import ConfigError
from roll_device.inputs.arithmetic import GENERATORS
from roll_device.inputs.fields import Sample, to_samples
from roll_device.inputs.records import read_records
from roll_device.inputs.settings import DataSettings
from roll_device.inputs.tasks import get_task

TASK_EVAL_SIZE = 64  # evaluation prompts of a toy task when eval.size is null


class PromptSource(Protocol):
    def batch(self, position: int, size: int) -> list[Sample]: ...

    def epoch(self, position: int) -> int: ...

    def eval_samples(self, count: int | None) -> list[Sample]: ...

    def steps_available(self, prompts_per_step: int) -> int | None: ...

    def fitting(self, fits: Callable[[Sample], bool]) -> PromptSource: ...


class TaskPrompts:
    """A toy task's endless stream; evaluation prompts come from negative indices (never trained)."""

    def __init__(self, settings: DataSettings, seed: int) -> None:
        self.task, self.settings, self.seed = get_task(settings.task), settings, seed

    def _sample(self, index: int) -> Sample:
        return Sample(self.task.prompt(self.seed, index, self.settings.prompt_length), None)

    def batch(self, position: int, size: int) -> list[Sample]:
        return [self._sample(position + i) for i in range(size)]

    def epoch(self, position: int) -> int:
        return 0

    def eval_samples(self, count: int | None) -> list[Sample]:
        return [self._sample(-1 - i) for i in range(count or TASK_EVAL_SIZE)]

    def steps_available(self, prompts_per_step: int) -> int | None:
        return None

    def fitting(self, fits: Callable[[Sample], bool]) -> TaskPrompts:
        """A toy task's prompts are short: all fit."""
        return self


class DatasetPrompts:
    """Records in a seeded order per epoch; `epochs` None cycles without end."""

    def __init__(
        self,
        train: list[Sample],
        held_out: list[Sample],
        seed: int,
        shuffle: bool,
        epochs: int | None,
        path: str | None = None,
    ):
        self.train, self.held_out = train, held_out
        self.seed, self.shuffle, self.epochs, self.path = seed, shuffle, epochs, path
        self._orders: dict[int, list[int]] = {}

    def order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.train)))
            if self.shuffle:
                random.Random(f"data:{self.seed}:{epoch}").shuffle(order)
            self._orders[epoch] = order
        return self._orders[epoch]

    def batch(self, position: int, size: int) -> list[Sample]:
        n = len(self.train)
        return [self.train[self.order(p // n)[p % n]] for p in range(position, position + size)]

    def epoch(self, position: int) -> int:
        return position // len(self.train)

    def eval_samples(self, count: int | None) -> list[Sample]:
        return self.held_out[:count]

    def steps_available(self, prompts_per_step: int) -> int | None:
        return None if self.epochs is None else self.epochs * len(self.train) // prompts_per_step

    def fitting(self, fits: Callable[[Sample], bool]) -> DatasetPrompts:
        """The records for which `fits` holds (prompts not too long for the engine), said once;
        none left to train on is a ConfigError."""
        train, held_out = [s for s in self.train if fits(s)], [s for s in self.held_out if fits(s)]
        dropped = len(self.train) + len(self.held_out) - len(train) - len(held_out)
        if dropped:
            print(
                f"data: left out {dropped} prompt(s) too long for rollout.max_model_len - algorithm.max_new_tokens"
            )
        if not train:
            raise ConfigError(
                f"every prompt of data.path={self.path} is too long for rollout.max_model_len with "
                "algorithm.max_new_tokens: raise rollout.max_model_len or shorten the prompts"
            )
        return DatasetPrompts(train, held_out, self.seed, self.shuffle, self.epochs, self.path)


def _count(size: float, total: int) -> int:
    return round(size * total) if size < 1 else int(size)


def split(samples: list[Sample], settings: DataSettings, seed: int) -> tuple[list[Sample], list[Sample]]:
    """(training, held-out) by a permutation of the records seeded with `seed`."""
    order = list(range(len(samples)))
    random.Random(f"split:{seed}").shuffle(order)
    count = _count(settings.eval_size, len(samples))
    if count >= len(samples):
        raise ConfigError(
            f"data.eval_size={settings.eval_size:g} holds out {count} of {len(samples)} records and leaves "
            "none to train on: make it smaller"
        )
    return [samples[i] for i in sorted(order[count:])], [samples[i] for i in sorted(order[:count])]


def _samples(settings: DataSettings, path: str) -> list[Sample]:
    return to_samples(read_records(path, settings.format), settings.prompt_key, settings.answer_key, path)


def load_source(settings: DataSettings, seed: int) -> PromptSource:
    """The source `settings` name, as the files give it (a missing key or an empty file refused),
    its orders seeded with the run's `seed`; `fitting` then drops the prompts too long for the engine."""
    if settings.path is None:
        return TaskPrompts(settings, seed)
    if settings.generate is not None:
        GENERATORS[settings.generate](settings.path, settings.eval_path)
    samples = _samples(settings, settings.path)
    if settings.eval_path is not None:
        held_out = _samples(settings, settings.eval_path)
        train = samples
        if settings.eval_size:
            held_out = held_out[: _count(settings.eval_size, len(held_out))]
    else:
        train, held_out = split(samples, settings, seed)
    return DatasetPrompts(train, held_out, seed, settings.shuffle, settings.epochs, settings.path)
