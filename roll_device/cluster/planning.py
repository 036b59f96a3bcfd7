"""The plan of a run's roles on a cluster: `plan_for(roles, cluster)` reads the connected
cluster's inventory (or takes one) and places the roles (a `PlanError` when they do not fit);
`inventory_here(cluster)` is what a local or simulated cluster will hold, known without Ray.
`run` and `plan` plan with the first, the checks before Ray starts with the second.
"""

from __future__ import annotations

from collections.abc import Mapping

from roll_device.cluster.inventory import Inventory, machine_inventory, read_inventory
from roll_device.cluster.plan import Plan, build_plan
from roll_device.cluster.settings import ClusterSettings, LocalCluster, RoleSettings, SimCluster
from roll_device.cluster.sim_nodes import declared_inventory


def inventory_here(cluster: ClusterSettings) -> Inventory:
    """The nodes `run` would plan on from this machine, without starting Ray (`cluster=sim`: the
    declared simulated nodes; otherwise this machine)."""
    if isinstance(cluster, SimCluster):
        return declared_inventory(cluster)
    return machine_inventory(cluster.num_cpus if isinstance(cluster, LocalCluster) else None)


def plan_for(
    roles: Mapping[str, RoleSettings],
    cluster: ClusterSettings,
    inventory: Inventory | None = None,
    engine_sizes: Mapping[str, int] | None = None,
) -> Plan:
    """The plan of `roles` (by name) on the connected cluster (or on `inventory`); `engine_sizes`:
    the devices each worker of a role holds, where more than one."""
    return build_plan(
        roles,
        inventory if inventory is not None else read_inventory(),
        cpu_per_worker=cluster.cpu_per_worker,
        engine_sizes=engine_sizes,
    )
