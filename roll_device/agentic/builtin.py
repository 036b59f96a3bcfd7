"""The built-in environments and tools; each needs several turns and runs with the tiny model
(its characters: digits, lowercase letters, ` +-*=?.,:`).

- `calculator` (tool `calc`): evaluates `a+b`, `a-b` or `a*b` of whole numbers.
- `arithmetic_tools`: a sum or difference of two one-digit numbers; the model may call `calc`
  (a tool turn), then answers; reward 1 for the right number. A turn that is neither a tool call
  nor a number is told `answer with a number` and the episode goes on.
- `guess_number`: a hidden digit 0-9 (from the task's seed: the same for a group); each turn's
  first digit is a guess, answered `higher` or `lower`; reward 1 for finding it.
"""

from __future__ import annotations

import random
import re

from roll_device.agentic.environment import Environment, Step, Task
from roll_device.agentic.tools import Tool

EXPRESSION = re.compile(r"^\s*(\d+)\s*([+*-])\s*(\d+)\s*$")
NUMBER = re.compile(r"-?\d+")
DIGIT = re.compile(r"\d")


def calculate(expression: str) -> str:
    found = EXPRESSION.match(str(expression))
    if found is None:
        raise ValueError(f"not a+b, a-b or a*b: {expression!r}")
    a, op, b = int(found.group(1)), found.group(2), int(found.group(3))
    return str({"+": a + b, "-": a - b, "*": a * b}[op])


CALCULATOR = Tool(
    calculate,
    {
        "name": "calc",
        "description": "the value of a+b, a-b or a*b",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 3+4"}},
            "required": ["expression"],
        },
    },
)


class ArithmeticTools(Environment):
    """See the module docstring."""

    def reset(self, task: Task) -> str:
        rng = random.Random(task.seed)
        a, b, op = rng.randrange(10), rng.randrange(10), rng.choice("+-")
        self.answer = a + b if op == "+" else a - b
        return f"{a}{op}{b}"

    def step(self, action: str) -> Step:
        found = NUMBER.search(action)
        if found is None:
            return Step("answer with a number", 0.0, False)
        return Step(None, float(int(found.group()) == self.answer), True)


class GuessNumber(Environment):
    """See the module docstring."""

    def reset(self, task: Task) -> str:
        self.secret = random.Random(task.seed).randrange(10)
        return "guess a digit"

    def step(self, action: str) -> Step:
        found = DIGIT.search(action)
        if found is None:
            return Step("say a digit", 0.0, False)
        guess = int(found.group())
        if guess == self.secret:
            return Step(None, 1.0, True, {"guess": guess})
        return Step("higher" if guess < self.secret else "lower", 0.0, False, {"guess": guess})


ENVIRONMENTS: dict[str, type[Environment]] = {
    "arithmetic_tools": ArithmeticTools,
    "guess_number": GuessNumber,
}
TOOLS: dict[str, Tool] = {"calculator": CALCULATOR}
