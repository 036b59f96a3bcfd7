"""The run's plan: every fact the run derives from its configuration and a cluster's nodes,
computed in one place and handed down like the configuration.

`build_run_plan(config, inventory)` places the roles that start (`RunConfig.roles_to_run`) on
`inventory` and derives from that placement, once:
- each role's compute platform (the CPU on a simulated GPU node) and strategy class;
- the devices each worker of a role holds (a rollout engine's tensor parallel size);
- the weight-sync path from `actor_train` to `actor_infer` (`sync`: one path value; the roles
  take turns on shared devices exactly when it is `colocated`);
- the roles hosted in another role's workers (`hosted`: a reference on the trainer's devices);
- the preflight's requests, one per role and node.

It is made twice per run: before Ray from the nodes the cluster will hold (`plan_here`: the gate,
`doctor`, `plan`), and by the run from the inventory Ray found. A placement that does not fit
raises `PlanError`, a sync path the placement cannot take a `ConfigError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from roll_device.cluster import Inventory, Plan, RoleSettings, build_plan
from roll_device.cluster.plan import compute_kind
from roll_device.comm import SyncNodes, SyncPlan, plan_sync
from roll_device.comm.paths import COLOCATED
from roll_device.doctor.checks import RoleRequest
from roll_device.errors import ConfigError, PlanError
from roll_device.models.hf_dir import num_experts
from roll_device.pipeline.config import ROLE_TYPES, SECTION_OF, RunConfig
from roll_device.platforms import Platform, get_platform
from strategies.base import INFERENCE
from strategies.registry import strategy_class, strategy_type

SYNC_SENDER, SYNC_RECEIVER = "actor_train", "actor_infer"


@dataclass(frozen=True)
class RunPlan:
    """The roles that start, where they run and what with; see the module docstring."""

    roles: Mapping[str, RoleSettings]
    placement: Plan
    platforms: Mapping[str, Platform]
    engine_sizes: Mapping[str, int]
    sync: SyncPlan
    requests: tuple[RoleRequest, ...]

    @property
    def colocated(self) -> bool:
        """Whether the rollout shares the trainer's devices (and the two take turns on them)."""
        return self.sync.path == COLOCATED

    def strategy(self, role: str) -> type:
        """The strategy class `role`'s workers run (a ConfigError when it does not serve the kind)."""
        return strategy_class(ROLE_TYPES[role], self.roles[role].strategy, self.platforms[role].kind)

    @cached_property
    def hosted(self) -> dict[str, str]:
        """Roles run inside another role's workers: a reference on exactly the trainer's devices,
        with a trainer strategy that can hold a second model in a process (pipeline/roles.py)."""
        if "reference" not in self.roles:
            return {}
        reference, train = self.placement.roles["reference"], self.placement.roles["actor_train"]
        if (reference.kind, reference.slots) != (train.kind, train.slots):
            return {}
        return {"reference": "actor_train"} if self.strategy("reference").hosts_reference else {}

    def sync_nodes(self, engine_size: int) -> SyncNodes:
        """Where the weight sync's ends run: each trainer rank's node, and each engine process's
        (every process of an engine of `engine_size` receives, on its worker's node)."""
        train, infer = self.placement.roles[SYNC_SENDER], self.placement.roles[SYNC_RECEIVER]
        return SyncNodes(
            tuple(train.worker_slots(rank)[0].node_id for rank in range(train.world_size)),
            tuple(
                infer.worker_slots(rank)[0].node_id
                for rank in range(infer.world_size)
                for _ in range(engine_size)
            ),
        )

    def format(self) -> str:
        """The device map (`Plan.format`)."""
        return self.placement.format()

    def summary(self) -> str:
        """Each role and its kind, in one line."""
        return ", ".join(
            f"{role} on {p.kind}" + (" (simulated)" if p.simulated else "")
            for role, p in self.placement.roles.items()
        )


def build_run_plan(config: RunConfig, inventory: Inventory) -> RunPlan:
    """The plan of `config`'s roles on `inventory`."""
    roles = config.roles_to_run().present()
    engine_sizes = config.engine_sizes()
    placement = build_plan(roles, inventory, config.cluster.cpu_per_worker, engine_sizes)
    platforms = {role: _compute_platform(placement, role) for role in placement.roles}
    sync = _sync_plan(placement, platforms, config.weight_sync.path)
    strategy_type(INFERENCE, roles[SYNC_RECEIVER].strategy).check_sync_path(config.rollout, sync.path)
    _check_adapters(config, platforms[SYNC_RECEIVER].kind)
    _check_route_records(config, platforms[SYNC_RECEIVER].kind)
    _check_expert_parallel(config, platforms[SYNC_RECEIVER].kind)
    requests = tuple(_requests(config, placement, sync))
    return RunPlan(roles, placement, platforms, engine_sizes, sync, requests)


def _check_adapters(config: RunConfig, kind: str) -> None:
    """A LoRA policy needs an engine that serves adapters on the rollout's kind, and keeps the base
    weights while it sleeps (its syncs after the first send the adapters only)."""
    if not config.trainer.lora.on:
        return
    name = config.roles.actor_infer.strategy
    engine = strategy_class(INFERENCE, name, kind)
    if not engine.serves_adapters(kind):
        raise ConfigError(
            f"trainer.lora.rank={config.trainer.lora.rank}: the {name} rollout engine cannot serve LoRA "
            f"adapters on {kind}: use rollout=vllm or rollout=hf, or trainer.lora.rank=null"
        )
    engine.check_adapters(config.trainer.lora)
    if getattr(config.rollout, "sleep_level", None) == 2:
        raise ConfigError(
            f"rollout.sleep_level=2 drops the engine's weights at each sleep, but with trainer.lora.rank="
            f"{config.trainer.lora.rank} a sync sends the adapters only: set rollout.sleep_level to 1 "
            "or null"
        )


def check_expert_adapters(config: RunConfig, platform: Platform | None, model_path: str) -> None:
    """A LoRA policy on a mixture-of-experts model (at `model_path`) needs an engine that serves
    adapters beside experts on the rollout's `platform` (None: its kind is not known before the
    cluster starts; not checked)."""
    if not config.trainer.lora.on or platform is None:
        return
    from transformers import AutoConfig

    if not num_experts(AutoConfig.from_pretrained(model_path)):
        return
    asked = f"trainer.lora.rank={config.trainer.lora.rank} on a mixture of experts (model.path={model_path})"
    fix = "use rollout=hf, or trainer.lora.rank=null"
    _check_engine_offers(
        config, platform.kind, asked, "lacks_expert_adapters", "cannot serve its adapters", fix
    )


def _check_engine_offers(
    config: RunConfig, kind: str, asked: str | None, member: str, lacking: str, fix: str
):
    """The rollout engine on `kind` offers what `asked` (the key=value that asks it; None: not
    asked) needs: its `member(kind)` says why not, else None."""
    if asked is None:
        return
    name = config.roles.actor_infer.strategy
    lacks = getattr(strategy_class(INFERENCE, name, kind), member)(kind)
    if lacks:
        raise ConfigError(f"{asked}: the {name} rollout engine {lacking} on {kind} ({lacks}): {fix}")


def _check_route_records(config: RunConfig, kind: str) -> None:
    """Routing replay needs an engine that records each token's routed experts on the rollout's kind."""
    asked = "trainer.routing_replay=true" if config.trainer.routing_replay else None
    fix = "use rollout=hf, or trainer.routing_replay=false"
    _check_engine_offers(config, kind, asked, "lacks_route_records", "cannot record routed experts", fix)


def _check_expert_parallel(config: RunConfig, kind: str) -> None:
    """Expert-parallel engines need an engine that offers them on the rollout's kind."""
    on = getattr(config.rollout, "expert_parallel", False)  # a key of the engines that have it
    fix = "set rollout.expert_parallel=false (each engine then holds every expert)"
    asked = "rollout.expert_parallel=true" if on else None
    _check_engine_offers(config, kind, asked, "lacks_expert_parallel", "has no expert parallelism", fix)


def plan_here(config: RunConfig) -> RunPlan | None:
    """The plan on a cluster whose nodes are known before Ray (this machine, or declared simulated
    nodes), without Ray; None on a remote cluster. A plan that does not fit declared nodes is
    refused here; on this machine it is None (refused with the inventory Ray finds, which may hold
    devices declared through `cluster.resources`, once it runs)."""
    if not config.cluster.plans_before_start:
        return None
    try:
        return build_run_plan(config, config.cluster.inventory_here())
    except PlanError:
        if config.cluster.declares_nodes:
            raise
        return None


def _compute_platform(placement: Plan, role: str) -> Platform:
    where = placement.roles[role]
    return get_platform(compute_kind(where.kind, where.simulated))


def _sync_plan(placement: Plan, platforms: Mapping[str, Platform], path: str) -> SyncPlan:
    sender, receiver = placement.roles[SYNC_SENDER], placement.roles[SYNC_RECEIVER]
    return plan_sync(
        platforms[SYNC_SENDER],
        platforms[SYNC_RECEIVER],
        colocated=placement.colocated(SYNC_SENDER, SYNC_RECEIVER),
        same_node=set(receiver.node_ids) == {sender.slots[0].node_id},
        forced=path,
    )


def _requests(config: RunConfig, placement: Plan, sync: SyncPlan) -> list[RoleRequest]:
    """One request per placed role and node it runs on (the rollout's says whether it shares its
    devices with the trainer: the sync path is `colocated`)."""
    used = placement.groups()
    requests = []
    for role, where in placement.roles.items():
        role_type = ROLE_TYPES[role]
        for node_id in where.node_ids:
            node = placement.inventory.node(node_id)
            requests.append(
                RoleRequest(
                    role=role,
                    kind=where.kind,
                    node_id=node_id,
                    node_name=node.name,
                    simulated=node.simulated,
                    devices=used[(where.kind, node_id)],
                    strategy_type=role_type if role_type in SECTION_OF else None,
                    strategy=config.roles.present()[role].strategy,
                    settings=config.strategy_settings(role),
                    colocated=sync.path == COLOCATED and role == SYNC_RECEIVER,
                )
            )
    return requests
