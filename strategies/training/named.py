"""A registry of functions by name, each a qualified name (`package.module:function`) imported when
first asked for: the advantage estimators and the policy losses (verl's and ROLL's registries).

A plugin adds one with `register` (in every process that resolves it), or names its function
directly in the configuration as `package.module:function`. The same registration again is a
no-op; a different function under a taken name is refused (a ValueError), as the strategies'
registry refuses one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from roll_device.errors import ConfigError


class Registry:
    """Functions of one kind (`what`: "advantage estimator", "policy loss") by name."""

    def __init__(self, what: str, key: str, entries: dict[str, str]) -> None:
        self.what, self.key = what, key
        self.entries = dict(entries)

    def register(self, name: str, qualified: str) -> None:
        """Serve `name` with the function `qualified` (`package.module:function`)."""
        taken = self.entries.get(name)
        if taken is not None and taken != qualified:
            raise ValueError(
                f"{self.what} '{name}' is already registered as {taken}: register {qualified} under another name"
            )
        self.entries[name] = qualified

    def names(self) -> list[str]:
        return sorted(self.entries)

    def qualified(self, name: str) -> str:
        """The qualified name behind `name` (a registered name, or itself when it is one), or a
        ConfigError that names the key and lists the choices."""
        try:
            return self.check(name)
        except ValueError as exc:
            raise ConfigError(f"{self.key}={name}: {exc}") from None

    def check(self, name: str) -> str:
        """`qualified` whose refusal (a ValueError) does not name the key: a config field's
        validator adds it."""
        if name in self.entries:
            return self.entries[name]
        if ":" in name:
            try:
                load(name)  # a plugin's own function: refused now when it does not import
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
            return name
        raise ValueError(
            f"unknown {self.what}, choose one of {', '.join(self.names())} (or a package.module:function)"
        )

    def resolve(self, name: str) -> Callable:
        return load(self.qualified(name))


def load(qualified: str) -> Callable:
    """The function `package.module:function` names, imported now (a ConfigError when it is not)."""
    module, _, attribute = qualified.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"cannot import {qualified!r} ({exc}): give an importable package.module:function"
        ) from None
