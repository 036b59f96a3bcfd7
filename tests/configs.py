"""The shipped configuration, read the way a run reads it, for tests: a whole run's config from
overrides (`run_config`), or one typed section of it with changes (`trainer_settings`,
`rollout_settings`, `weight_sync`, `cluster_settings`). The values a test does not change are the
YAML files' (configs/), so that tests start from what users start from. The composition (once per
process for the same overrides and environment) and `changed` are the benchmarks' own
(benchmarks/configs.py); this module adds the sections only tests ask for.
"""

from __future__ import annotations

from typing import Any

from benchmarks.configs import changed, run_config, trainer_settings
from roll_device.cluster.settings import ClusterSettings
from roll_device.comm.options import WeightSyncOptions
from strategies.inference.settings import RolloutSettings

__all__ = [
    "changed",
    "cluster_settings",
    "rollout_settings",
    "run_config",
    "trainer_settings",
    "weight_sync",
]


def rollout_settings(name: str = "vllm", **changes: Any) -> RolloutSettings:
    """The `rollout=<name>` section with `changes`."""
    return changed(run_config(f"rollout={name}").rollout, "rollout", **changes)


def weight_sync(**changes: Any) -> WeightSyncOptions:
    """The `weight_sync` section with `changes`."""
    return changed(run_config().weight_sync, "weight_sync", **changes)


def cluster_settings(*overrides: str) -> ClusterSettings:
    """The `cluster` section for overrides of the `cluster` group (`cluster=sim`, `cluster.num_cpus=2`)."""
    return run_config(*overrides).cluster
