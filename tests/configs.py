"""The shipped configuration, read the way a run reads it, for tests: a whole run's config from
overrides (`run_config`), or one typed section of it with changes (`trainer_settings`,
`rollout_settings`, `weight_sync`, `cluster_settings`). The values a test does not change are the
YAML files' (configs/), so that tests start from what users start from.

A configuration is composed once per session for the same overrides and the same environment
variables the YAML files read (Hydra's composition takes a fifth of a second, and the suite asks
for the same few hundreds of times); its sections are frozen, so a test cannot change another's.
Errors are not kept: a bad override is refused again each time.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from roll_device.cluster.settings import ClusterSettings
from roll_device.comm.options import WeightSyncOptions
from roll_device.commands.gate import load_config
from roll_device.pipeline.config import RunConfig
from roll_device.settings import Section, read_section
from strategies.inference.settings import RolloutSettings
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


def rollout_settings(name: str = "vllm", **changes: Any) -> RolloutSettings:
    """The `rollout=<name>` section with `changes`."""
    return changed(run_config(f"rollout={name}").rollout, "rollout", **changes)


def weight_sync(**changes: Any) -> WeightSyncOptions:
    """The `weight_sync` section with `changes`."""
    return changed(run_config().weight_sync, "weight_sync", **changes)


def cluster_settings(*overrides: str) -> ClusterSettings:
    """The `cluster` section for overrides of the `cluster` group (`cluster=sim`, `cluster.num_cpus=2`)."""
    return run_config(*overrides).cluster
