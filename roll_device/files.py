"""Folders a user names (a run directory, the tiny model's folder, export's output): made up
front, or refused in one line that names the setting, the folder and why, before anything is
written into them; and the ordinary permissions of the files written there."""

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


def give_ordinary_mode(files: list[Path]) -> None:
    """Give `files` the mode a plain `open()` gives a new file (0666 less the umask: 0644 under
    umask 022). safetensors 0.8 writes a file as a temporary one, which is made 0600, and renames
    it into place (safetensors#782), so a saved model would be readable by its owner only."""
    umask = os.umask(0)  # reading the umask means setting it: put it back at once
    os.umask(umask)
    for file in files:
        file.chmod(0o666 & ~umask)
