"""A plan made real in Ray: one placement group per (kind, node), one bundle per device slot.

Bundles are device-neutral: `{<platform.ray_resource>: 1}` for an accelerator kind (`GPU`, `NPU`,
a plugin's key), `{"CPU": cpu_per_worker}` for the CPU; the devices of one engine form one bundle
of k times that (`Plan.bundles`), so that its worker holds them all and Ray sets the kind's
visible-devices variable to them. Each group is pinned to its node with the
node-id label selector and STRICT_PACK. A worker requests its share of its slot's bundle:
`platform.ray_actor_options(share)` (`num_gpus` for GPU kinds, `resources` for the others) and no
CPU, or `num_cpus = cpu_per_worker * share` for a CPU worker. Colocated roles share a bundle
through these fractions.

`reserve(plan)` creates the groups once (kept on the plan) and `release(plan)` removes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roll_device.cluster.inventory import CPU_RESOURCE
from roll_device.cluster.plan import Plan, round_down
from roll_device.errors import PlanError
from roll_device.platforms import HOST_KIND, get_platform

NODE_ID_LABEL = "ray.io/node-id"


def bundle(plan: Plan, kind: str, devices: int = 1) -> dict[str, float]:
    """The bundle of `devices` device slots of `kind`."""
    if kind == HOST_KIND:
        return {CPU_RESOURCE: plan.cpu_per_worker * devices}
    return {get_platform(kind).ray_resource: float(devices)}


def worker_request(plan: Plan, role: str, rank: int) -> dict[str, Any]:
    """The resource part of a worker's Ray options: its share of each of its slots."""
    placement = plan.roles[role]
    share = placement.worker_share(rank) * placement.engine_size
    if placement.kind == HOST_KIND:
        return {"num_cpus": round_down(plan.cpu_per_worker * share)}
    return {"num_cpus": 0, **get_platform(placement.kind).ray_actor_options(share)}


@dataclass
class Reservation:
    """The placement groups of a plan, by (kind, node id)."""

    groups: dict[tuple[str, str], Any]

    def scheduling_strategy(self, plan: Plan, role: str, rank: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        placement = plan.roles[role]
        slot = placement.worker_slots(rank)[0]
        return PlacementGroupSchedulingStrategy(
            placement_group=self.groups[(placement.kind, slot.node_id)],
            placement_group_bundle_index=plan.bundle_index(role, rank),
            placement_group_capture_child_tasks=False,
        )

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for group in self.groups.values():
            remove_placement_group(group)
        self.groups = {}


def reserve(plan: Plan, timeout_s: float = 120.0) -> Reservation:
    """The plan's placement groups, created once (kept as `plan.reservation`); a PlanError if Ray
    cannot grant them within `timeout_s`."""
    if plan.reservation is None:
        plan.reservation = _create_groups(plan, timeout_s)
    return plan.reservation


def release(plan: Plan) -> None:
    """Remove the plan's placement groups (workers in them should be gone first)."""
    if plan.reservation is not None:
        plan.reservation.release()
        plan.reservation = None


def _create_groups(plan: Plan, timeout_s: float) -> Reservation:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    groups = {}
    for (kind, node_id), sizes in plan.bundles().items():
        groups[(kind, node_id)] = placement_group(
            [bundle(plan, kind, size) for size in sizes],
            strategy="STRICT_PACK",
            bundle_label_selector=[{NODE_ID_LABEL: node_id}] * len(sizes),
        )
    waits = {key: group.ready() for key, group in groups.items()}
    ready, _ = ray.wait(list(waits.values()), num_returns=len(waits), timeout=timeout_s)
    if len(ready) < len(waits):
        missing = [key for key, ref in waits.items() if ref not in ready]
        for group in groups.values():
            remove_placement_group(group)
        kind, node_id = missing[0]
        node = plan.inventory.node(node_id)
        raise PlanError(
            f"Ray did not grant {plan.groups()[(kind, node_id)]} {kind} device slot(s) on node "
            f"'{node.name}' within {timeout_s:g} s: another job holds them or the node is gone "
            "(check `ray status`)"
        )
    return Reservation(groups)
