"""Environments and tools by the names the configuration gives them: a built-in name
(roll_device/agentic/builtin.py) or a qualified `package.module.name`, resolved on the driver (the
gate's checks) and on the env workers alike."""

from __future__ import annotations

from roll_device.agentic.builtin import ENVIRONMENTS, TOOLS
from roll_device.agentic.environment import Environment
from roll_device.agentic.tools import SCHEMA_ATTRIBUTE, Tool, schema_problem
from roll_device.errors import ConfigError
from roll_device.naming import resolve_named


def resolve_environment(name: str) -> type[Environment]:
    """The environment class `agentic.environment` names (a ConfigError when it is none)."""
    found = resolve_named(name, ENVIRONMENTS, "agentic.environment", "env workers")
    if not (isinstance(found, type) and issubclass(found, Environment)):
        raise ConfigError(
            f"agentic.environment='{name}' names {found!r}, not a subclass of "
            "roll_device.agentic.Environment: see docs/agentic.md"
        )
    return found


def resolve_tool(name: str) -> Tool:
    """The tool `name` (an entry of `agentic.tools`) names; a ConfigError for an unknown name or
    a function without a schema."""
    found = resolve_named(name, TOOLS, "agentic.tools", "env workers")
    if callable(found) and not isinstance(found, Tool):
        schema = getattr(found, SCHEMA_ATTRIBUTE, None)
        if schema is None:
            raise ConfigError(
                f"agentic.tools: '{name}' is a function without a JSON schema: decorate it with "
                "@roll_device.agentic.tool({...}) or export a roll_device.agentic.Tool"
            )
        found = Tool(found, schema)
    if not isinstance(found, Tool):
        raise ConfigError(f"agentic.tools: '{name}' names {found!r}, not a tool (a Tool or a @tool function)")
    problem = schema_problem(found.schema)
    if problem:
        raise ConfigError(f"agentic.tools: '{name}': {problem}")
    return found
