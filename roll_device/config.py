"""Compose the Hydra configuration outside `@hydra.main` (for `plan`, `submit` and tests).

The config tree lives in `configs/` at the repository root; `ROLL_DEVICE_CONFIG_DIR` points
elsewhere. Overrides use Hydra's syntax (`key=value`, `+new.key=value`, `group=option`).
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

from roll_device.errors import ConfigError

CONFIG_NAME = "config"


def config_dir() -> Path:
    configured = os.environ.get("ROLL_DEVICE_CONFIG_DIR")
    path = Path(configured) if configured else Path(__file__).resolve().parent.parent / "configs"
    if not (path / f"{CONFIG_NAME}.yaml").exists():
        raise ConfigError(
            f"no {CONFIG_NAME}.yaml in {path}: set ROLL_DEVICE_CONFIG_DIR to the configs/ folder "
            "of a roll-device checkout"
        )
    return path


def compose(overrides: list[str] | None = None, with_hydra: bool = False) -> DictConfig:
    """The composed configuration for `overrides` (with the `hydra` node when `with_hydra`: the
    run directory), or a ConfigError naming the bad override."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return hydra_compose(
                config_name=CONFIG_NAME, overrides=list(overrides or []), return_hydra_config=with_hydra
            )
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"bad configuration or override: {one_line(str(exc))}") from exc


def one_line(message: str) -> str:
    """Hydra's and OmegaConf's multi-line reports as one line."""
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())
