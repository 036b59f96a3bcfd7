"""The software stack installed here, as facts the checks take (tests hand in stand-ins).

Versions come from `importlib.metadata` (nothing is imported: an NPU package on a host without
its toolkit would break `import torch`); toolkit versions from each platform's `toolkit_version()`.
Which distributions to report comes from the registries: torch, each platform's torch companion,
every package a strategy declares (with the builds it conflicts with and the releases it must
match), then the libraries every run uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from roll_device.packages import Package

TORCH = "torch"
TORCHVISION = "torchvision"  # pulled in by engine installs; must match torch's build
COMMON = ("ray", "transformers", TORCHVISION)


@dataclass(frozen=True)
class StackFacts:
    """Installed versions by distribution (None: not installed), toolkit versions by name."""

    versions: dict[str, str | None]
    toolkits: dict[str, str | None]

    def version(self, distribution: str) -> str | None:
        return self.versions.get(distribution)


def installed_version(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def platform_classes() -> list[type]:
    """The platform class of every kind a role may name."""
    from roll_device.platforms import get_platform, known_kinds

    return [type(get_platform(kind)) for kind in known_kinds()]


def declared_packages() -> list[Package]:
    """Every package a platform (torch companion) or a strategy declares."""
    from strategies.registry import declared_packages as strategy_packages

    companions = [cls.torch_companion for cls in platform_classes() if cls.torch_companion is not None]
    return list(dict.fromkeys(companions + strategy_packages()))


def reported_distributions(packages: list[Package]) -> list[str]:
    """torch, every declared distribution with its conflicts and match targets, then COMMON."""
    names = [TORCH]
    for package in packages:
        names += [package.distribution, *package.conflicts]
        if package.matches is not None:
            names.append(package.matches[0])
    return list(dict.fromkeys(names + list(COMMON)))


def gather_facts(packages: list[Package] | None = None) -> StackFacts:
    """The facts of this process's environment."""
    packages = declared_packages() if packages is None else packages
    versions = {name: installed_version(name) for name in reported_distributions(packages)}
    toolkits = {cls.toolkit_name: cls.toolkit_version() for cls in platform_classes() if cls.toolkit_name}
    return StackFacts(versions=versions, toolkits=toolkits)
