"""What each pipeline role's strategy is set up with, and the roles as the doctor checks them.

`strategy_settings(cfg, role, rollout_colocated)` is the settings dict a role's strategy gets
(`rollout` for `actor_infer`, `trainer` for the trainer roles; the rollout learns whether it shares
its devices with the trainer). `sync_plan(plan, path)` is the weight-sync path the run will take,
and `compute_platform(plan, role)` the platform a role's workers compute with. `role_requests(cfg,
plan)` turns a plan into one `RoleRequest` per role and node, for the doctor and the preflight.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from roll_device.cluster import Plan
from roll_device.cluster.plan import compute_kind
from roll_device.comm import SyncPlan, WeightSyncOptions, plan_sync
from roll_device.comm.paths import COLOCATED
from roll_device.doctor.checks import RoleRequest
from roll_device.pipeline.schema import ROLE_TYPES
from roll_device.platforms import get_platform
from strategies.base import INFERENCE, TRAIN

SETTINGS_SECTION = {INFERENCE: "rollout", TRAIN: "trainer"}
STRATEGY_TYPES = tuple(SETTINGS_SECTION)  # role types whose strategy comes from strategies/


def strategy_settings(cfg: DictConfig, role: str, rollout_colocated: bool) -> dict[str, Any]:
    """The config section `role`'s strategy is initialized with (empty for other roles)."""
    section = SETTINGS_SECTION.get(ROLE_TYPES[role])
    if section is None:
        return {}
    settings = OmegaConf.to_container(cfg[section], resolve=True)
    if section == "rollout" and "colocated" in settings:  # the engine frees memory when it shares
        settings["colocated"] = rollout_colocated
    return settings


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


def rollout_colocated(cfg: DictConfig, plan: Plan) -> bool:
    """Whether weights reach the rollout on shared devices (the sync path the run will take)."""
    return sync_plan(plan, WeightSyncOptions.from_config(cfg.weight_sync).path).path == COLOCATED


def role_requests(cfg: DictConfig, plan: Plan) -> list[RoleRequest]:
    """One request per planned role and node it runs on."""
    colocated = rollout_colocated(cfg, plan)
    used = plan.groups()
    requests = []
    for role, placement in plan.roles.items():
        role_type = ROLE_TYPES[role]
        settings = strategy_settings(cfg, role, colocated)
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
                    strategy_type=role_type if role_type in STRATEGY_TYPES else None,
                    strategy=str(cfg.roles[role].strategy),
                    settings=settings,
                )
            )
    return requests
