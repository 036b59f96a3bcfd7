"""`roll-device plan [overrides]`: the cluster's nodes and the device map the run would get; a
PlanError (exit 2) when the roles do not fit. Files the config names are not checked: they live
where the run runs."""

from __future__ import annotations

from roll_device.cluster import plan_for, read_inventory, start_cluster
from roll_device.commands.gate import check_simulation, load_config


def plan_command(overrides: list[str]) -> int:
    config = load_config(overrides)  # a bad override fails here, before a cluster starts
    check_simulation(config, "plan")
    with start_cluster(config.cluster) as handle:
        inventory = read_inventory()
        print(f"cluster '{handle.name}' at {handle.address}:")
        print(inventory.format(), flush=True)
        plan = plan_for(config.roles_to_run().present(), config.cluster, inventory, config.engine_sizes())
        print("\ndevice plan:")
        print(plan.format(), flush=True)
    return 0
