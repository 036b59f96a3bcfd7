"""Multi-turn agentic rollouts (docs/agentic.md): environments (`reset` -> first observation,
`step(action)` -> observation, reward, done, info), tools (a Python function with a JSON schema),
tool calls parsed from the model's text in the chat template's tool-call format, the chat rendered
turn by turn, and trajectories that keep the engine's token ids with a mask over the model's own.

This floor sits beside `roll_device.inputs`: it imports no strategy and no Ray. The `env` role's
worker (roll_device/pipeline/env_worker.py) hosts environment instances through `EnvHost`, and the
pipeline's `AgenticStep` (roll_device/pipeline/agentic_step.py) drives the turns.
"""

from roll_device.agentic.environment import (
    Environment,
    EnvironmentFaultError,
    Step,
    Task,
)
from roll_device.agentic.registry import resolve_environment, resolve_tool
from roll_device.agentic.tools import Tool, tool

__all__ = [
    "Environment",
    "EnvironmentFaultError",
    "Step",
    "Task",
    "Tool",
    "resolve_environment",
    "resolve_tool",
    "tool",
]
