"""`roll-device plan` and `roll-device submit`, and the plan check `run` shares with `plan`.

`plan_from_config(cfg)` reads the connected cluster's inventory and builds the plan from `roles`
(a `PlanError` when it does not fit): `run` calls it before starting any worker.
`inventory_here(cluster_cfg)` is what a local or simulated cluster will hold, known without Ray.
"""

from __future__ import annotations

import os

from roll_device.cluster.inventory import Inventory, machine_inventory, read_inventory
from roll_device.cluster.launcher import setting, start_cluster
from roll_device.cluster.plan import DEFAULT_CPU_PER_WORKER, Plan, build_plan, parse_roles
from roll_device.cluster.sim_nodes import declared_inventory
from roll_device.cluster.submit import entrypoint, runtime_env, submit_job
from roll_device.config import compose
from roll_device.errors import ConfigError

SUBMITTABLE = ("run", "plan")


def inventory_here(cluster_cfg) -> Inventory:
    """The nodes `run` would plan on from this machine, without starting Ray (`cluster=sim`: the
    declared simulated nodes; otherwise this machine)."""
    if setting(cluster_cfg, "name") == "sim":
        return declared_inventory(setting(cluster_cfg, "head", {}), setting(cluster_cfg, "nodes", []))
    return machine_inventory(setting(cluster_cfg, "num_cpus"))


def plan_from_config(cfg, inventory: Inventory | None = None) -> Plan:
    """The plan of `cfg.roles` on the connected cluster (or on `inventory`)."""
    return build_plan(
        cfg.roles,
        inventory if inventory is not None else read_inventory(),
        cpu_per_worker=setting(cfg.cluster, "cpu_per_worker", DEFAULT_CPU_PER_WORKER),
    )


def plan_command(overrides: list[str]) -> int:
    """Print the cluster's nodes and the device map; a PlanError when the roles do not fit."""
    cfg = compose(overrides)
    parse_roles(cfg.roles)  # bad role settings fail before a cluster starts
    with start_cluster(cfg.cluster) as handle:
        inventory = read_inventory()
        print(f"cluster '{handle.name}' at {handle.address}:")
        print(inventory.format(), flush=True)
        plan = plan_from_config(cfg, inventory)
        print("\ndevice plan:")
        print(plan.format(), flush=True)
    return 0


def submit_command(
    overrides: list[str], address: str | None = None, no_wait: bool = False, command: str = "run"
) -> int:
    """Send `roll-device <command> <overrides>` to an existing cluster through the Ray Jobs API."""
    if command not in SUBMITTABLE:
        raise ConfigError(f"submit runs one of {', '.join(SUBMITTABLE)}, not '{command}'")
    cfg = compose(overrides)  # a bad override fails here, before anything is sent
    parse_roles(cfg.roles)
    if setting(cfg.cluster, "name") == "sim":
        raise ConfigError(
            "cluster=sim starts its own cluster on this machine: run it with `roll-device run "
            "cluster=sim`; submit sends a run to an existing cluster (cluster=local there joins it)"
        )
    address = (
        address
        or setting(cfg.cluster, "dashboard_address")
        or os.environ.get("RAY_API_SERVER_ADDRESS")
        or _http_ray_address()
    )
    if not address:
        raise ConfigError(
            "submit needs the cluster's dashboard address: --address http://<head>:8265, "
            "cluster.dashboard_address=..., or RAY_API_SERVER_ADDRESS"
        )
    job_env = runtime_env(setting(cfg.cluster, "runtime_env"))
    return submit_job(address, entrypoint(command, overrides), job_env, no_wait=no_wait)


def _http_ray_address() -> str | None:
    value = os.environ.get("RAY_ADDRESS", "")
    return value if value.startswith(("http://", "https://")) else None
