"""`roll-device plan [overrides]`: the cluster's nodes and the device map the run would get; a
PlanError (exit 2) when the roles do not fit, found before Ray starts where the nodes are known
(this machine, declared simulated nodes). Files the config names are not checked: they live
where the run runs."""

from __future__ import annotations

from roll_device.cluster import read_inventory, start_cluster
from roll_device.commands.gate import check_simulation, load_config
from roll_device.pipeline.output import quiet_driver
from roll_device.pipeline.run_plan import build_run_plan, plan_here
from roll_device.pipeline.step_plan import step_plan


def plan_command(overrides: list[str]) -> int:
    config = load_config(overrides)  # a bad override fails here, before a cluster starts
    check_simulation(config, "plan")
    plan_here(config)  # what can be refused from the nodes known before Ray is refused now
    print(step_plan(config), flush=True)
    quiet_driver()  # Ray's start-up notices, as for a run
    with start_cluster(config.cluster) as handle:
        inventory = read_inventory()
        print(f"cluster '{handle.name}' at {handle.address}:")
        print(inventory.format(), flush=True)
        plan = build_run_plan(config, inventory)
        print("\ndevice plan:")
        print(plan.format(), flush=True)
    return 0
