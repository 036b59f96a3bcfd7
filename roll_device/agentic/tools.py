"""Tools: a Python function with a JSON schema (the `function` object of OpenAI's and Hugging
Face's tool format: `name`, `description`, `parameters`), and running one with a timeout.

A tool is named in `agentic.tools` by a built-in name or `package.module.attr`, where `attr` is a
`Tool` or a function decorated with `@tool(schema)`; a plain function has no schema and is refused
(roll_device/agentic/registry.py).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SCHEMA_ATTRIBUTE = "tool_schema"


@dataclass(frozen=True)
class Tool:
    function: Callable[..., Any]
    schema: Mapping[str, Any]  # {"name", "description", "parameters": a JSON schema object}

    @property
    def name(self) -> str:
        return self.schema["name"]

    @property
    def parameters(self) -> list[str]:
        """The parameters' names, the required ones first (a positional call fills them in order)."""
        properties = list(self.schema["parameters"].get("properties", {}))
        required = list(self.schema["parameters"].get("required", []))
        return required + [p for p in properties if p not in required]

    def rendered(self) -> dict[str, Any]:
        """The tool as a chat template's `tools` list holds it."""
        return {"type": "function", "function": dict(self.schema)}

    def problem(self, arguments: Mapping[str, Any]) -> str:
        """Why `arguments` cannot be passed to this tool ("" when they can)."""
        params = self.schema["parameters"]
        missing = [p for p in params.get("required", []) if p not in arguments]
        unknown = [a for a in arguments if a not in params.get("properties", {})]
        if missing:
            return f"tool {self.name} needs {', '.join(missing)}"
        return f"tool {self.name} has no parameter {', '.join(unknown)}" if unknown else ""


def tool(schema: Mapping[str, Any]) -> Callable[[Callable], Callable]:
    """Give a function its JSON schema, so that `agentic.tools` can name it."""

    def attach(function: Callable) -> Callable:
        setattr(function, SCHEMA_ATTRIBUTE, dict(schema))
        return function

    return attach


def schema_problem(schema: Any) -> str:
    """Why `schema` is not a tool's JSON schema ("" when it is)."""
    if not isinstance(schema, Mapping) or not isinstance(schema.get("name"), str):
        return "its schema needs a string 'name'"
    parameters = schema.get("parameters")
    if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
        return "its schema needs 'parameters': a JSON schema of type 'object'"
    return ""


class CallTimeout(TimeoutError):
    """A call that did not return within its timeout (its thread is left behind, daemonic)."""


def call_with_timeout(function: Callable[[], Any], timeout_s: float) -> Any:
    """`function()`'s result, or its exception raised here, or `CallTimeout` after `timeout_s`.
    A thread per call: one that hangs holds no pool slot the next call would wait for."""
    done: queue.Queue = queue.Queue(maxsize=1)

    def run() -> None:
        try:
            done.put((True, function()))
        except BaseException as exc:  # noqa: BLE001 (handed to the caller as it is)
            done.put((False, exc))

    threading.Thread(target=run, daemon=True, name="agentic-call").start()
    try:
        ok, value = done.get(timeout=timeout_s)
    except queue.Empty:
        raise CallTimeout(f"no answer within {timeout_s:g}s") from None
    if not ok:
        raise value
    return value
