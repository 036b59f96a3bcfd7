"""What each pipeline role runs with, as the plan places it: the platform a role's workers compute
with (`compute_platform`), the weight-sync path from `actor_train` to `actor_infer` (`sync_plan`),
and the roles as the doctor and the preflight check them (`role_requests`: one `RoleRequest` per
role and node, with the role's typed settings and whether it shares its devices with a trainer).
"""

from __future__ import annotations

from roll_device.cluster import Plan
from roll_device.cluster.plan import compute_kind
from roll_device.comm import SyncPlan, plan_sync
from roll_device.comm.paths import COLOCATED
from roll_device.doctor.checks import RoleRequest
from roll_device.pipeline.config import ROLE_TYPES, SECTION_OF, RunConfig
from roll_device.platforms import get_platform


def compute_platform(plan: Plan, role: str):
    """The platform `role`'s workers compute with (the CPU on a simulated GPU node)."""
    placement = plan.roles[role]
    return get_platform(compute_kind(placement.kind, placement.simulated))


def sync_plan(plan: Plan, path: str) -> SyncPlan:
    """The weight-sync path from `actor_train` to `actor_infer` on `plan` (`path` forces one)."""
    train, infer = plan.roles["actor_train"], plan.roles["actor_infer"]
    colocated = plan.colocated("actor_train", "actor_infer")
    same_node = set(infer.node_ids) == {train.slots[0].node_id}
    return plan_sync(
        compute_platform(plan, "actor_train"),
        compute_platform(plan, "actor_infer"),
        colocated=colocated,
        same_node=same_node,
        forced=path,
    )


def role_requests(config: RunConfig, plan: Plan) -> list[RoleRequest]:
    """One request per planned role and node it runs on."""
    colocated = sync_plan(plan, config.weight_sync.path).path == COLOCATED
    used = plan.groups()
    requests = []
    for role, placement in plan.roles.items():
        role_type = ROLE_TYPES[role]
        for node_id in placement.node_ids:
            node = plan.inventory.node(node_id)
            requests.append(
                RoleRequest(
                    role=role,
                    kind=placement.kind,
                    node_id=node_id,
                    node_name=node.name,
                    simulated=node.simulated,
                    devices=used[(placement.kind, node_id)],
                    strategy_type=role_type if role_type in SECTION_OF else None,
                    strategy=config.roles.present()[role].strategy,
                    settings=config.strategy_settings(role),
                    colocated=colocated and role == "actor_infer",
                )
            )
    return requests
