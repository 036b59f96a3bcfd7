"""The `cluster` config section (one type per `cluster=` option, chosen by `name`) and one entry
of the `roles` section: typed once, read by `roll_device.settings.read_section`.

`configs/cluster/<name>.yaml` holds the values a run starts from; a simulated node's keys that
an entry leaves out have their defaults here. `RoleSettings` is one role of any name;
`check_colocation` what roles say of each other (targets and cycles); whether they fit a cluster
is the plan's to say (plan.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StrictBool, StrictFloat, field_validator, model_validator

from roll_device.cluster.inventory import (
    ACCELERATOR_TYPE_RESOURCE,
    HEAD_RESOURCE,
    SIMULATED_LABEL,
    Inventory,
    inventory_from_nodes,
    machine_inventory,
)
from roll_device.errors import ConfigError
from roll_device.platforms import known_kinds
from roll_device.platforms.registry import AUTO
from roll_device.settings import Count, NonNegative, Section, read_section

HEAD_NAME = "head"
MISSING = "???"  # Hydra's mark of a mandatory value not given
CpuPerWorker = Annotated[StrictFloat, Field(gt=0, le=64, description="CPUs each CPU-role worker reserves")]
SetupTimeout = Annotated[
    StrictFloat,
    Field(gt=0, description="seconds each wait of the workers' set-up may take before the run ends"),
]
ResourceCounts = dict[str, NonNegative]  # Ray declares a node's resources in whole numbers


class SimNode(Section):
    """One node of the simulated cluster: a `ray start` process that declares accelerators."""

    name: str | None = None
    num_cpus: NonNegative = 1
    num_gpus: NonNegative = 0
    resources: ResourceCounts = Field(default_factory=dict, description="custom resources, e.g. {NPU: 4}")
    accelerator_type: str | None = Field(None, description="e.g. AMD-Instinct-MI300X: the GPUs count as rocm")

    def declared_resources(self) -> dict[str, float]:
        """The node's custom resources (its accelerator type included)."""
        resources = dict(self.resources)
        if self.accelerator_type:
            resources[ACCELERATOR_TYPE_RESOURCE + self.accelerator_type] = 1
        return resources

    @property
    def simulated(self) -> bool:
        """Whether the node declares accelerators (it has none: they are simulated)."""
        return bool(self.num_gpus or self.declared_resources())

    @field_validator("resources")
    @classmethod
    def _no_reserved(cls, resources: dict[str, float]) -> dict[str, float]:
        reserved = {"CPU", "GPU"} & set(resources)
        if reserved:
            raise ValueError(
                f"{', '.join(sorted(reserved))} cannot be a custom resource: use num_cpus / num_gpus"
            )
        return resources


class ClusterSection(Section):
    """What every `cluster` option answers about itself, so that callers ask instead of switching
    on its type."""

    # Every role runs on this machine's own devices (a simulation named by ROLL_DEVICE then
    # simulates nothing the workers see).
    on_this_machine: ClassVar[bool] = False
    # The nodes are known before Ray starts (this machine, or declared): the run's plan can be
    # made and checked then.
    plans_before_start: ClassVar[bool] = False
    # The nodes are declared by the config: a plan that does not fit them is final before Ray.
    declares_nodes: ClassVar[bool] = False
    # Why `submit` cannot send a run on this cluster (None: it can).
    submit_refusal: ClassVar[str | None] = None

    def inventory_here(self) -> Inventory:
        """The nodes a run would plan on from this machine, without Ray: this machine."""
        return machine_inventory(None)

    def checks_roles_here(self) -> bool:
        """Whether the cluster is this machine alone, so that each role's checks can run in this
        process before Ray starts."""
        return False

    def submit_target(self) -> tuple[str | None, dict[str, Any] | None]:
        """The dashboard address (None: found elsewhere) and the runtime environment a submitted
        job gets from this section."""
        return None, None


class LocalCluster(ClusterSection):
    """Embedded Ray on this machine (joins the job's cluster inside a Ray job)."""

    name: Literal["local"]
    address: None
    num_cpus: Count | None = Field(description="null: all of this machine's")
    resources: ResourceCounts | None = Field(description="custom resources this node declares")
    include_dashboard: StrictBool
    cpu_per_worker: CpuPerWorker
    setup_timeout_s: SetupTimeout

    on_this_machine: ClassVar[bool] = True
    plans_before_start: ClassVar[bool] = True

    def inventory_here(self) -> Inventory:
        return machine_inventory(self.num_cpus)

    def checks_roles_here(self) -> bool:
        return not os.environ.get("RAY_ADDRESS")  # set: the run joins a Ray job's cluster


class SimCluster(ClusterSection):
    """Several Ray nodes on this machine that declare accelerators they do not have."""

    name: Literal["sim"]
    address: None
    include_dashboard: StrictBool
    cpu_per_worker: CpuPerWorker
    setup_timeout_s: SetupTimeout
    head: SimNode
    nodes: list[SimNode]

    plans_before_start: ClassVar[bool] = True
    declares_nodes: ClassVar[bool] = True
    submit_refusal: ClassVar[str | None] = (
        "cluster=sim starts its own cluster on this machine: run it with `roll-device run "
        "cluster=sim`; submit sends a run to an existing cluster (cluster=local there joins it)"
    )

    def inventory_here(self) -> Inventory:
        """The declared nodes, without starting them (the node ids are the names: a plan on them
        is for checking, not for reserving)."""
        records = []
        for number, (name, node) in enumerate(self.entries()):
            resources = node.declared_resources()
            labels = {SIMULATED_LABEL: "true"} if node.simulated else {}
            resources.update(CPU=float(node.num_cpus), GPU=float(node.num_gpus))
            if number == 0:
                resources[HEAD_RESOURCE] = 1.0
            records.append(
                {"Alive": True, "NodeID": name, "NodeName": name, "Resources": resources, "Labels": labels}
            )
        return inventory_from_nodes(records)

    @model_validator(mode="after")
    def _named(self) -> SimCluster:
        for number, node in enumerate(self.nodes):
            if not node.name:
                raise ConfigError(f"cluster.nodes.{number} has no name: give each sim node a `name`")
        return self

    def entries(self) -> list[tuple[str, SimNode]]:
        """(name, node) of the head and every node, in start order."""
        return [(self.head.name or HEAD_NAME, self.head)] + [(str(n.name), n) for n in self.nodes]


class RemoteCluster(ClusterSection):
    """An existing Ray cluster, by address."""

    name: Literal["remote"]
    address: str = Field(description="<host>:6379, ray://<host>:10001 or auto")
    dashboard_address: str | None
    runtime_env: dict[str, Any] | None
    cpu_per_worker: CpuPerWorker
    setup_timeout_s: SetupTimeout

    @field_validator("address")
    @classmethod
    def _given(cls, address: str) -> str:
        if not address.strip() or address == MISSING:
            raise ConfigError(
                "cluster=remote needs the cluster's address: cluster.address=<host:port>, "
                "ray://<host>:10001 or auto"
            )
        return address

    def submit_target(self) -> tuple[str | None, dict[str, Any] | None]:
        return self.dashboard_address, self.runtime_env


ClusterSettings = LocalCluster | SimCluster | RemoteCluster  # one of the ClusterSection types
CLUSTER_TYPES: dict[str, type[ClusterSettings]] = {
    "local": LocalCluster,
    "sim": SimCluster,
    "remote": RemoteCluster,
}


def read_cluster(values: Any) -> ClusterSettings:
    """The `cluster` section as the type its `name` chooses."""
    if isinstance(values, ClusterSection):
        return values
    name = (values or {}).get("name")
    if name not in CLUSTER_TYPES:
        raise ConfigError(f"cluster.name={name!r}: choose one of {', '.join(CLUSTER_TYPES)} (cluster=<name>)")
    return read_section(CLUSTER_TYPES[name], values, "cluster")


class RoleSettings(Section):
    """One role: the kind it runs on, how many devices, its strategy, whose devices it shares."""

    device: str = Field(description="a device kind or auto")
    num_devices: Annotated[Count, Field(description="one worker per device")]
    strategy: str
    colocate_with: str | None

    @field_validator("device")
    @classmethod
    def _known_kind(cls, device: str) -> str:
        device = device.strip().lower()
        valid = known_kinds()
        if device != AUTO and device not in valid:
            raise ValueError(f"valid values are {AUTO}, {', '.join(valid)}")
        return device


def check_colocation(roles: Mapping[str, RoleSettings]) -> None:
    """Colocation targets name roles that run, never the role itself, and form no cycle."""
    if not roles:
        raise ConfigError("no roles configured: `roles` needs at least one role")
    for name, role in roles.items():
        if role.colocate_with is None:
            continue
        if role.colocate_with == name:
            raise ConfigError(f"roles.{name}.colocate_with names the role itself: set it to null")
        if role.colocate_with not in roles:
            raise ConfigError(
                f"roles.{name}.colocate_with='{role.colocate_with}' names no configured role "
                f"(roles: {', '.join(roles)})"
            )
    for name in roles:
        owner(name, roles)


def owner(name: str, roles: Mapping[str, RoleSettings]) -> str:
    """The role that owns the devices `name` runs on (follows colocate_with chains)."""
    seen = [name]
    while roles[seen[-1]].colocate_with is not None:
        nxt = roles[seen[-1]].colocate_with
        if nxt in seen:
            raise ConfigError(f"colocate_with forms a cycle: {' -> '.join(seen + [nxt])}")
        seen.append(nxt)
    return seen[-1]
