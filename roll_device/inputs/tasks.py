"""Prompt streams and rule rewards of the shipped tasks.

A task makes prompt `i` deterministically from (seed, i), so the data position (how many prompts
were consumed) is all a checkpoint needs to continue the same stream, and scores a decoded
response with a rule in [0, 1].
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from roll_device.errors import ConfigError


@dataclass(frozen=True)
class Task:
    name: str
    describe: str
    make_prompt: Callable[[random.Random, int], str]
    reward: Callable[[str, str], float]

    def prompt(self, seed: int, index: int, length: int) -> str:
        return self.make_prompt(random.Random(f"{self.name}:{seed}:{index}"), length)


def _letters_then_equals(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(length)) + "="


def _share_of_digits(prompt: str, response: str) -> float:
    if not response:
        return 0.0
    return sum(ch.isdigit() for ch in response) / len(response)


def _share_of_first_letter(prompt: str, response: str) -> float:
    if not response:
        return 0.0
    return sum(ch == prompt[0] for ch in response) / len(response)


TASKS = {
    task.name: task
    for task in (
        Task(
            "digits",
            "reward = share of response characters that are digits (a tiny model learns it in minutes)",
            _letters_then_equals,
            _share_of_digits,
        ),
        Task(
            "echo_first",
            "reward = share of response characters equal to the prompt's first letter (needs attention)",
            _letters_then_equals,
            _share_of_first_letter,
        ),
    )
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ConfigError(f"unknown data.task '{name}': choose one of {', '.join(sorted(TASKS))}")
    return TASKS[name]
