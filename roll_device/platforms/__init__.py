"""One class per device kind and the registry that picks this process's platform. The names below
are imported on first use (each kind's class loads torch); `ENV_VAR` is here so that the CLI reads
it without them."""

from importlib import import_module

ENV_VAR = "ROLL_DEVICE"  # overrides detection (registry.py)
HOME = {
    "Platform": "base",
    "HOST_KIND": "cpu",
    "process_status": "cpu",
    "release_host_heap": "cpu",
    "current_platform": "registry",
    "get_platform": "registry",
    "known_kinds": "registry",
    "resolved_at": "registry",
}

__all__ = [
    "HOST_KIND",
    "Platform",
    "current_platform",
    "get_platform",
    "known_kinds",
    "process_status",
    "release_host_heap",
    "resolved_at",
]


def __getattr__(name: str):
    """A name of `HOME`, from its module (imported now)."""
    if name in HOME:
        return getattr(import_module(f"roll_device.platforms.{HOME[name]}"), name)
    raise AttributeError(f"module 'roll_device.platforms' has no attribute '{name}'")
