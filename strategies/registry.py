"""The strategies by (role type, name), each a qualified class name resolved when first asked
for, and the class for a role on a device kind.

A strategy serves the kinds whose platform has what it needs (`Strategy.serves`), so a plugin
kind is served by every strategy whose needs its platform meets: no table names kinds. A strategy
is registered by one line here, or by `register_strategy` (a plugin's or a test's own backend);
its class names the type of its config section (`settings_cls`).
"""

from __future__ import annotations

import importlib

from roll_device.errors import ConfigError
from roll_device.packages import Package
from roll_device.platforms import get_platform, known_kinds
from strategies.base import CRITIC, INFERENCE, TRAIN, Strategy

STRATEGIES: dict[tuple[str, str], str] = {
    (INFERENCE, "vllm"): "strategies.inference.vllm:VllmStrategy",
    (INFERENCE, "hf"): "strategies.inference.hf:HfStrategy",
    (TRAIN, "fsdp"): "strategies.training.fsdp:FsdpTrainStrategy",
    (TRAIN, "megatron"): "strategies.training.megatron:MegatronTrainStrategy",
    (CRITIC, "fsdp"): "strategies.training.critic:FsdpCriticStrategy",
    (CRITIC, "megatron"): "strategies.training.megatron_critic:MegatronCriticStrategy",
}


def register_strategy(role_type: str, name: str, qualified_name: str) -> None:
    """Serve `role_type` strategy `name` with the class `qualified_name` (`package.module:Class`),
    in this process (register in every process that starts it, or name it in STRATEGIES). The same
    registration again is a no-op; a different class under a taken name is refused (a ValueError),
    as vLLM's factories refuse one."""
    taken = STRATEGIES.get((role_type, name))
    if taken is not None and taken != qualified_name:
        raise ValueError(
            f"{role_type} strategy '{name}' is already registered as {taken}: register "
            f"{qualified_name} under another name"
        )
    STRATEGIES[(role_type, name)] = qualified_name


def names(role_type: str) -> list[str]:
    """The registered strategy names of `role_type`, sorted."""
    return sorted(n for (t, n) in STRATEGIES if t == role_type)


def qualified_name(role_type: str, name: str) -> str:
    """`package.module:Class` of `role_type` strategy `name`, or a ConfigError listing the options.
    A worker is handed this name, so that it needs no registration of its own."""
    qualified = STRATEGIES.get((role_type, name))
    if qualified is None:
        raise ConfigError(
            f"unknown {role_type} strategy '{name}': choose one of {', '.join(names(role_type)) or 'none'}"
        )
    return qualified


def load(qualified: str) -> type[Strategy]:
    """The class a qualified name (`package.module:Class`) names, imported now."""
    module, _, attribute = qualified.partition(":")
    return getattr(importlib.import_module(module), attribute)


def strategy_type(role_type: str, name: str) -> type[Strategy]:
    """The class registered as `role_type` strategy `name` (imported now)."""
    return load(qualified_name(role_type, name))


def served_kinds(cls: type[Strategy]) -> list[str]:
    """The known device kinds `cls` serves, in registry order."""
    return [kind for kind in known_kinds() if cls.serves(get_platform(kind))]


def strategy_class(role_type: str, name: str, kind: str) -> type:
    """The strategy class for (role type, name, device kind), or a ConfigError listing options."""
    return serving(strategy_type(role_type, name), kind, f"{role_type} strategy '{name}'")


def serving(cls: type[Strategy], kind: str, what: str) -> type[Strategy]:
    """`cls` when it runs on device kind `kind`, else a ConfigError that names it as `what` and
    the kinds it runs on."""
    if not cls.serves(get_platform(kind)):
        raise ConfigError(
            f"{what} does not run on device kind '{kind}': it supports {', '.join(served_kinds(cls))}"
        )
    return cls


def registered() -> dict[tuple[str, str, str], type]:
    """(role type, name, kind) -> class, for every known kind each strategy serves."""
    found = {}
    for role_type, name in STRATEGIES:
        cls = strategy_type(role_type, name)
        found.update({(role_type, name, kind): cls for kind in served_kinds(cls)})
    return found


def declared_packages() -> list[Package]:
    """Every package any strategy declares on any kind it serves, once each, in registry order."""
    found: dict[Package, None] = {}
    for (_role_type, _name, kind), cls in registered().items():
        found.update(dict.fromkeys(cls.requirements(kind).packages))
    return list(found)
