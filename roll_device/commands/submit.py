"""`roll-device submit [--address URL] [--no-wait] [--command run|plan] [overrides]`: send
`roll-device <command> <overrides>` to an existing cluster through the Ray Jobs API (the checkout
ships as the job's working directory, roll_device/cluster/submit.py). The overrides are read and
checked here first; files and modules they name are checked where the job runs."""

from __future__ import annotations

import os

from roll_device.cluster.submit import entrypoint, runtime_env, submit_job
from roll_device.commands.gate import load_config
from roll_device.errors import ConfigError
from roll_device.pipeline.output import quiet_driver


def submit_command(
    overrides: list[str], address: str | None = None, no_wait: bool = False, command: str = "run"
) -> int:
    """`command` (run or plan, as the command line allows) with `overrides`, sent to the cluster."""
    config = load_config(overrides)  # a bad override fails here, before anything is sent
    if config.cluster.submit_refusal:
        raise ConfigError(config.cluster.submit_refusal)
    dashboard, cluster_env = config.cluster.submit_target()
    address = address or dashboard or os.environ.get("RAY_API_SERVER_ADDRESS") or _http_ray_address()
    if not address:
        raise ConfigError(
            "submit needs the cluster's dashboard address: --address http://<head>:8265, "
            "cluster.dashboard_address=..., or RAY_API_SERVER_ADDRESS"
        )
    job_env = runtime_env(address, cluster_env)
    quiet_driver()  # Ray's notice that it turned token authentication on for this client
    return submit_job(address, entrypoint(command, overrides), job_env, no_wait=no_wait)


def _http_ray_address() -> str | None:
    value = os.environ.get("RAY_ADDRESS", "")
    return value if value.startswith(("http://", "https://")) else None
