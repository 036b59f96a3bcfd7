"""Folders a user names (a run directory, the tiny model's folder): made up front, or refused in
one line that names the setting, the folder and why, before anything is written into them."""

from __future__ import annotations

import os
from pathlib import Path

from roll_device.errors import ConfigError


def make_folder(path: str | Path, setting: str) -> Path:
    """`path` made with its parents (kept if it is there), or a ConfigError naming `setting`."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = f"{type(exc).__name__}: {exc.strerror or exc}"
    else:
        if os.access(path, os.W_OK | os.X_OK):
            return path
        reason = "not writable"
    raise ConfigError(
        f"cannot make the folder {path} for {setting} ({reason}): choose a folder you can write"
    )
