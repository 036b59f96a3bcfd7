"""Environments and tools that misbehave, for the fault and refusal tests (named by qualified
name, as a user's would be)."""

from __future__ import annotations

import time

from roll_device.agentic import Environment, Step, Task


class Echo(Environment):
    """Answers every turn with `ok`; done after its third turn, reward 1 for each turn."""

    def reset(self, task: Task) -> str:
        self.turns = 0
        return f"go {task.seed % 10}"

    def step(self, action: str) -> Step:
        self.turns += 1
        return Step(None if self.turns == 3 else "ok", 1.0, self.turns == 3)


class RaisesOnStep(Echo):
    def step(self, action: str) -> Step:
        raise RuntimeError("the simulator crashed")


class HangsOnStep(Echo):
    def step(self, action: str) -> Step:
        time.sleep(30)
        return super().step(action)


class Malformed(Echo):
    def step(self, action: str) -> Step:
        return Step("ok", float("nan"), False)


def no_schema(expression: str) -> str:
    return expression


NOT_AN_ENVIRONMENT = object()
