"""The environment interface and its registry.

An `Environment` is made fresh for each trajectory (its class is called without arguments).
`reset(task)` returns the first observation (the user's message); `step(action)` gets the
model's turn as text (when it is not a tool call) and returns a `Step`: the next observation
(None when done), the turn's reward, whether the episode is done, and a dict of info. Environments
are named like reward functions: a built-in name or `package.module.Class`
(roll_device/agentic/registry.py).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import Any

from roll_device.errors import RollDeviceError


@dataclass(frozen=True)
class Task:
    """What one trajectory is about: the data's prompt and answer, and a seed shared by the
    trajectories of one group (GRPO compares trajectories of the same task)."""

    prompt: str
    answer: str | None
    seed: int


@dataclass
class Step:
    """What an environment returns for one action."""

    observation: str | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Environment(abc.ABC):
    """One episode's environment; see the module docstring."""

    @abc.abstractmethod
    def reset(self, task: Task) -> str:
        """Start an episode of `task`; returns the first observation."""

    @abc.abstractmethod
    def step(self, action: str) -> Step:
        """The model's turn `action` (its text, special tokens left out) -> the next `Step`."""

    def close(self) -> None:
        """The episode is over (done, a budget, the step's end): free what `reset` took."""


class EnvironmentFaultError(RollDeviceError, RuntimeError):
    """An environment raised, hung past `agentic.env_timeout_s` or returned a malformed step, with
    `agentic.on_env_fault=end_run`: the run ends (exit 1) and says how to resume."""

    exit_code = 1


def malformed(step: Any) -> str:
    """Why `step` is not a well-formed `Step` ("" when it is)."""
    if not isinstance(step, Step):
        return f"step() returned {type(step).__name__}, not a Step"
    if not isinstance(step.done, bool):
        return f"Step.done is {step.done!r}, not a bool"
    if (
        isinstance(step.reward, bool)
        or not isinstance(step.reward, int | float)
        or not math.isfinite(step.reward)
    ):
        return f"Step.reward is {step.reward!r}, not a finite number"
    if not step.done and not isinstance(step.observation, str):
        return f"Step.observation is {step.observation!r}, but an episode that goes on needs a str"
    return ""
