"""The Ray cluster layer: each role on the device kind its config names, on the nodes that have it.

Public API (see docs/cluster.md):

- `ClusterSettings` (`read_cluster(values)`), `RoleSettings`: the `cluster` section and one role
  of the `roles` section, typed (settings.py).
- `start_cluster(cluster) -> ClusterHandle`: connect to the `local`, `sim` or `remote` cluster
  (a context manager; `.shutdown()` ends only what it started).
- `read_inventory() -> Inventory`: alive nodes, CPUs, devices by kind, simulated or not.
- `build_plan(roles, inventory, cpu_per_worker) -> Plan`: every
  role placed on devices of its kind, one worker per device; `PlanError` when it does not fit.
  `Plan.format()` is the device map; `Plan.roles[role]` a `RolePlan`.
- `RoleWorker`: base class of role actors; binds its kind's platform and device on start.
- `WorkerGroup(plan, role, worker_cls, *args, **kwargs)`: one actor per device, with `call_all`,
  `scatter_gather`, `call_rank0`, `async_call_all`, `master_addr_port`, `kill`; `shard(batch, n)`.
"""

from roll_device.cluster.group import DispatchError, WorkerGroup, shard
from roll_device.cluster.inventory import Inventory, NodeInfo, read_inventory
from roll_device.cluster.launcher import ClusterHandle, start_cluster
from roll_device.cluster.plan import Plan, RolePlan, Slot, build_plan
from roll_device.cluster.settings import ClusterSettings, RoleSettings, read_cluster
from roll_device.cluster.worker import RoleWorker

__all__ = [
    "ClusterHandle",
    "ClusterSettings",
    "DispatchError",
    "Inventory",
    "NodeInfo",
    "Plan",
    "RolePlan",
    "RoleSettings",
    "RoleWorker",
    "Slot",
    "WorkerGroup",
    "build_plan",
    "read_cluster",
    "read_inventory",
    "shard",
    "start_cluster",
]
