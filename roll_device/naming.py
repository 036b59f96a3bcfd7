"""Objects named in the configuration: a built-in name, or a qualified `package.module.attr`
(or `package.module:attr`) importable on the driver and on the workers that use it (reward
functions on the reward workers, environments and tools on the env workers)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from roll_device.errors import ConfigError


def resolve_named(name: str, built_in: Mapping[str, Any], key: str, workers: str) -> Any:
    """What `name` (the value of config key `key`) names: a key of `built_in`, or an import that
    `workers` (the role's workers, for the message) must be able to make too."""
    if name in built_in:
        return built_in[name]
    module_name, _, attribute = name.replace(":", ".").rpartition(".")
    if not module_name:
        raise ConfigError(
            f"{key}='{name}' is unknown: choose one of {', '.join(built_in)} or a qualified package.module.name"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{key}='{name}': cannot import module '{module_name}' ({exc}); put it on PYTHONPATH "
            f"(the {workers} import it too)"
        ) from exc
    if not hasattr(module, attribute):
        raise ConfigError(f"{key}='{name}': module '{module_name}' has no '{attribute}'")
    return getattr(module, attribute)
