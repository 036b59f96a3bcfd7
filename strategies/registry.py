"""The strategies by (role type, name), and the class for a role on a device kind.

A strategy serves the kinds whose platform has what it needs (`Strategy.serves`), so a plugin
kind is served by every strategy whose needs its platform meets: no table names kinds. This module
imports the strategy packages; they import only strategies/base.py.
"""

from __future__ import annotations

from roll_device.errors import ConfigError
from roll_device.packages import Package
from roll_device.platforms import get_platform, known_kinds
from roll_device.platforms.engines import VLLM
from strategies.base import INFERENCE, TRAIN, Strategy
from strategies.inference.hf import HfStrategy
from strategies.inference.vllm import VllmStrategy
from strategies.training.fsdp import FsdpTrainStrategy
from strategies.training.megatron import MegatronTrainStrategy

STRATEGIES: dict[tuple[str, str], type[Strategy]] = {
    (INFERENCE, VLLM): VllmStrategy,
    (INFERENCE, "hf"): HfStrategy,
    (TRAIN, "fsdp"): FsdpTrainStrategy,
    (TRAIN, "megatron"): MegatronTrainStrategy,
}


def served_kinds(cls: type[Strategy]) -> list[str]:
    """The known device kinds `cls` serves, in registry order."""
    return [kind for kind in known_kinds() if cls.serves(get_platform(kind))]


def strategy_class(role_type: str, name: str, kind: str) -> type:
    """The strategy class for (role type, name, device kind), or a ConfigError listing options."""
    cls = STRATEGIES.get((role_type, name))
    if cls is None:
        names = sorted(n for (r, n) in STRATEGIES if r == role_type)
        raise ConfigError(
            f"unknown {role_type} strategy '{name}': choose one of {', '.join(names) or 'none'}"
        )
    if not cls.serves(get_platform(kind)):
        raise ConfigError(
            f"{role_type} strategy '{name}' does not run on device kind '{kind}': "
            f"it supports {', '.join(served_kinds(cls))}"
        )
    return cls


def registered() -> dict[tuple[str, str, str], type]:
    """(role type, name, kind) -> class, for every known kind each strategy serves."""
    return {
        (role_type, name, kind): cls
        for (role_type, name), cls in STRATEGIES.items()
        for kind in served_kinds(cls)
    }


def declared_packages() -> list[Package]:
    """Every package any strategy declares on any kind it serves, once each, in registry order."""
    found: dict[Package, None] = {}
    for (_role_type, _name, kind), cls in registered().items():
        found.update(dict.fromkeys(cls.requirements(kind).packages))
    return list(found)
