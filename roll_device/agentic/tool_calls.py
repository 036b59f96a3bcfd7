"""Tool calls in a model's text, in the chat template's tool-call format.

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as Qwen2.5's and Qwen3's
  templates write them (found by `<tool_call>` in the template);
- `tiny`: `name?value,value` at the start of the turn, arguments in the order of the tool's
  parameters (the project's tiny template, roll_device/agentic/chat.py: the tiny character
  tokenizer has no braces or quotes).

`format_of(template)` finds a template's format (None: the template writes no tool calls).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

HERMES = "hermes"
TINY = "tiny"
TINY_MARK = "{#- tool calls: tiny -#}"  # how the tiny template names its format
HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
TINY_CALL = re.compile(r"^\s*([a-z][a-z_]*)\?([^.]*)")


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments by parameter name (positional ones under
    their index, until the tool's parameters name them); `error` when the call's text is broken."""

    name: str
    arguments: Mapping[str, Any]
    error: str = ""


def parse_hermes(text: str) -> list[ToolCall]:
    calls = []
    for body in HERMES_CALL.findall(text):
        try:
            value = json.loads(body)
            calls.append(ToolCall(str(value["name"]), dict(value.get("arguments") or {})))
        except (ValueError, KeyError, TypeError) as exc:
            calls.append(ToolCall("", {}, f"a tool call that is not JSON with a name ({type(exc).__name__})"))
    return calls


def parse_tiny(text: str) -> list[ToolCall]:
    found = TINY_CALL.match(text)
    if found is None:
        return []
    values = [v.strip() for v in found.group(2).split(",")] if found.group(2).strip() else []
    return [ToolCall(found.group(1), {str(i): v for i, v in enumerate(values)})]


PARSERS: dict[str, Callable[[str], list[ToolCall]]] = {HERMES: parse_hermes, TINY: parse_tiny}


def format_of(template: str | None) -> str | None:
    """The tool-call format `template` writes, or None when it writes none."""
    if not template:
        return None
    if TINY_MARK in template:
        return TINY
    return HERMES if "<tool_call>" in template else None


def parse_calls(text: str, format_name: str) -> list[ToolCall]:
    return PARSERS[format_name](text)


def named_arguments(call: ToolCall, parameters: list[str]) -> dict[str, Any]:
    """`call`'s arguments by parameter name (positional ones take the parameters in order)."""
    return {
        (parameters[int(k)] if k.isdigit() and int(k) < len(parameters) else k): v
        for k, v in call.arguments.items()
    }
