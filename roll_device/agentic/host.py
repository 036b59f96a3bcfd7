"""`EnvHost`: the environment instances of one env worker, one per live trajectory, and the
tools they share. A model turn that holds tool calls (in the template's format) runs the tools,
each within `tool_timeout_s`, and answers with their results as `tool` messages; any other turn
goes to the environment's `step`, within `env_timeout_s`. A tool that fails (unknown name, bad
arguments, raised, timed out) answers with its error and is counted; an environment that raises,
hangs or returns a malformed step makes a `fault` reply (the driver ends that trajectory or the
run, `agentic.on_env_fault`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from roll_device.agentic.environment import Task, malformed
from roll_device.agentic.registry import resolve_environment, resolve_tool
from roll_device.agentic.tool_calls import ToolCall, named_arguments, parse_calls
from roll_device.agentic.tools import CallTimeout, call_with_timeout


@dataclass
class Reply:
    """The environment's side of one turn (or of `reset`: the first observation)."""

    messages: list[dict[str, Any]] = field(default_factory=list)  # to append to the chat
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    fault: str = ""  # why the environment failed ("" when it did not)
    tool_calls: int = 0
    tool_failures: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class HostSpec:
    """What a host needs of `agentic`: names are resolved where it runs."""

    environment: str
    tools: tuple[str, ...]
    tool_format: str | None
    env_timeout_s: float
    tool_timeout_s: float


class EnvHost:
    def __init__(self, settings: HostSpec) -> None:
        self.settings = settings
        self.env_class = resolve_environment(settings.environment)
        self.tools = {t.name: t for t in map(resolve_tool, settings.tools)}
        self.live: dict[int, Any] = {}  # trajectory id -> its environment

    def reset(self, items: list[tuple[int, Task]]) -> list[Reply]:
        return [self._timed(key, lambda k=key, t=task: self._reset(k, t)) for key, task in items]

    def step(self, items: list[tuple[int, str]]) -> list[Reply]:
        return [self._timed(key, lambda k=key, a=action: self._step(k, a)) for key, action in items]

    def close(self, items: list[tuple[int, Any]]) -> list[None]:
        """Let go of the environments of the trajectories `items` name (those still held)."""
        for key, _ in items:
            env = self.live.pop(key, None)
            if env is not None:  # a close that fails frees nothing more: the episode is over either way
                with contextlib.suppress(Exception):
                    call_with_timeout(env.close, self.settings.env_timeout_s)
        return [None] * len(items)

    def _timed(self, key: int, answer) -> Reply:
        started = time.perf_counter()
        reply = answer()
        reply.seconds = time.perf_counter() - started
        if reply.done or reply.fault:
            self.close([(key, None)])  # the episode is over: its environment is let go
        return reply

    def _reset(self, key: int, task: Task) -> Reply:
        def start() -> str:
            self.live[key] = env = self.env_class()
            return env.reset(task)

        try:
            first = call_with_timeout(start, self.settings.env_timeout_s)
        except Exception as exc:  # noqa: BLE001 (an environment may raise anything: a fault)
            return Reply(fault=_fault("reset", exc))
        if not isinstance(first, str):
            return Reply(fault=f"reset() returned {type(first).__name__}, not the first observation (a str)")
        return Reply([{"role": "user", "content": first}])

    def _step(self, key: int, action: str) -> Reply:
        calls = (
            parse_calls(action, self.settings.tool_format) if self.settings.tool_format and self.tools else []
        )
        if calls:
            return self._run_tools(calls)
        try:
            step = call_with_timeout(lambda: self.live[key].step(action), self.settings.env_timeout_s)
        except Exception as exc:  # noqa: BLE001
            return Reply(fault=_fault("step", exc))
        problem = malformed(step)
        if problem:
            return Reply(fault=f"malformed step: {problem}")
        messages = [] if step.done else [{"role": "user", "content": step.observation}]
        return Reply(messages, float(step.reward), step.done, dict(step.info))

    def _run_tools(self, calls: list[ToolCall]) -> Reply:
        results, failures = [], 0
        for call in calls:
            text = self._run_tool(call)
            failures += text.startswith("error:")
            results.append({"role": "tool", "name": call.name, "content": text})
        return Reply(results, tool_calls=len(calls), tool_failures=failures)

    def _run_tool(self, call: ToolCall) -> str:
        """The tool's answer, or `error: ...` for a call that failed."""
        found = self.tools.get(call.name)
        if call.error or found is None:
            return f"error: {call.error or 'no tool ' + call.name}"
        arguments = named_arguments(call, found.parameters)
        problem = found.problem(arguments)
        if problem:
            return f"error: {problem}"
        try:
            return str(call_with_timeout(lambda: found.function(**arguments), self.settings.tool_timeout_s))
        except Exception as exc:  # noqa: BLE001 (a tool may raise anything: its error goes to the model)
            return f"error: {type(exc).__name__.lower()}"  # in characters a tiny tokenizer knows


def _fault(where: str, exc: BaseException) -> str:
    if isinstance(exc, CallTimeout):
        return f"{where}() hung: {exc} (agentic.env_timeout_s)"
    return f"{where}() raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
