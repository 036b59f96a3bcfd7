"""The weight-sync path names (`weight_sync.path`), defined here once and imported elsewhere."""

from __future__ import annotations

from roll_device.errors import ConfigError

AUTO = "auto"  # chosen from the two roles' kinds and placement (planner.py)
COLOCATED = "colocated"
COLLECTIVE = "collective"
BRIDGE = "bridge"
DIRECT = "rdt"  # Ray Direct Transport; only when asked for (`auto` never picks it, planner.py)
PATHS = (COLOCATED, COLLECTIVE, BRIDGE, DIRECT)
PATH_CHOICES = (AUTO, *PATHS)


def check_path(path: str) -> None:
    """A ConfigError unless `path` is one of `PATH_CHOICES`."""
    if path not in PATH_CHOICES:
        raise ConfigError(f"weight_sync.path='{path}' is not a path: choose one of {', '.join(PATH_CHOICES)}")
