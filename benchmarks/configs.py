"""The shipped configuration, read the way a run reads it: a whole run's config from Hydra overrides
(`run_config`), a typed section of it with changes (`changed`, `trainer_settings`). Benchmarks start
from the YAML files (configs/) as users do; tests build their sections on these (tests/configs.py).

A configuration is composed once per process for the same overrides and the same environment
variables the YAML files read (Hydra's composition takes a fifth of a second, and the test suite
asks for the same few hundreds of times); its sections are frozen, so no caller can change
another's. Errors are not kept: a bad override is refused again each time.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from roll_device.commands.gate import load_config
from roll_device.pipeline.config import RunConfig
from roll_device.settings import Section, read_section
from strategies.training.settings import TrainSettings

COMPOSE_ENV = ("ROLL_DEVICE_CONFIG_DIR", "ROLL_DEVICE_HOME", "HOME")  # what composition reads


def run_config(*overrides: str) -> RunConfig:
    """The run's configuration for Hydra `overrides`, as `roll-device run` reads it."""
    return _composed(overrides, tuple(os.environ.get(name) for name in COMPOSE_ENV))


@functools.cache
def _composed(overrides: tuple[str, ...], _environment: tuple[str | None, ...]) -> RunConfig:
    return load_config(list(overrides))


def changed(section: Section, name: str, **changes: Any) -> Section:
    """`section` with `changes`, read (checked) again as section `name` of the config."""
    return read_section(type(section), {**section.model_dump(), **changes}, name)


def trainer_settings(name: str = "fsdp", **changes: Any) -> TrainSettings:
    """The `trainer=<name>` section with `changes`."""
    return changed(run_config(f"trainer={name}").trainer, "trainer", **changes)
