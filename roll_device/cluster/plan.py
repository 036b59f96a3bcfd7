"""The role plan: which devices of which nodes each role gets, decided before anything starts.

`build_plan(roles_cfg, inventory)` reads `roles.<role>.device` (a kind or `auto`), `num_devices`
and `colocate_with`, and places every role on devices of its kind, one worker per device:

- `auto` resolves to the accelerator kind the cluster has the most devices of (ties go to the
  detection order: npu, cuda, rocm, plugins), or to the CPU when the cluster has no accelerator.
  A colocated role with `auto` takes the kind of the role it shares devices with.
- Roles that own devices are placed largest first; each takes free devices from the nodes with
  the most free devices of its kind first, so a role spans as few nodes as possible. CPU roles
  prefer nodes without accelerators.
- A colocated role (`colocate_with: other`) shares the first `num_devices` devices of `other`
  (chains resolve to the role that owns the devices); each worker then requests an equal
  fraction of its device.
- A CPU "device" is a worker slot of `cpu_per_worker` CPUs (`cluster.cpu_per_worker`):
  a node with C CPUs offers floor(C / cpu_per_worker) of them. Accelerator workers request no CPU.
- A role whose workers each hold several devices (`engine_sizes`: a rollout engine of tensor
  parallel size k) has one worker per k devices, all on one node: its devices are taken k at a
  time, a node's free devices in runs of k. Such a role shares no devices (colocation with it is
  refused), and its num_devices must be a multiple of k.

Device ids in the plan are node-local slots (0, 1, ... per kind and node). The placement group of
a (kind, node) has one bundle per device, except that the k devices of one engine form one bundle
of k (`Plan.bundles`), so that Ray gives the engine's worker all of them. Ray picks the physical device behind each
bundle when the group is reserved; workers report it (`RoleWorker.info()`).

Whatever does not fit raises `PlanError` naming the role, the kind, the count wanted and the
count available; bad values raise `ConfigError`. Nothing here talks to Ray: placement.py reserves
a plan's devices (`reserve(plan)`) and releases them (`release(plan)`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roll_device.cluster.inventory import Inventory, NodeInfo, format_table
from roll_device.cluster.settings import RoleSettings, check_colocation, owner
from roll_device.errors import PlanError
from roll_device.platforms import HOST_KIND, get_platform
from roll_device.platforms.registry import AUTO

RAY_RESOURCE_STEP = 1e-4  # Ray keeps resource amounts to 4 decimal places


@dataclass(frozen=True)
class Slot:
    """One device of one node: `index` is its node-local slot among the devices of its kind."""

    node_id: str
    node_name: str
    index: int


@dataclass(frozen=True)
class RolePlan:
    """Where one role runs: one slot and one device share per device, `engine_size` devices per
    worker (rank r holds slots r*engine_size ... (r+1)*engine_size - 1, on one node)."""

    role: str
    kind: str
    num_devices: int
    colocate_with: str | None
    slots: tuple[Slot, ...]
    shares: tuple[float, ...]
    simulated: bool
    engine_size: int = 1

    @property
    def world_size(self) -> int:
        return len(self.slots) // self.engine_size

    def worker_slots(self, rank: int) -> tuple[Slot, ...]:
        """The devices of the worker at `rank`."""
        return self.slots[rank * self.engine_size : (rank + 1) * self.engine_size]

    def worker_share(self, rank: int) -> float:
        """The share of each of its devices the worker at `rank` requests."""
        return self.shares[rank * self.engine_size]

    @property
    def node_ids(self) -> list[str]:
        """The nodes this role runs on, in rank order."""
        return list(dict.fromkeys(slot.node_id for slot in self.slots))

    def device_ids(self, node_id: str) -> list[int]:
        return [slot.index for slot in self.slots if slot.node_id == node_id]


@dataclass
class Plan:
    """Every role's placement on one cluster, plus the Ray reservation once placement.py's
    `reserve(plan)` ran."""

    roles: dict[str, RolePlan]
    inventory: Inventory
    cpu_per_worker: float
    reservation: Any = field(default=None, repr=False, compare=False)

    def groups(self) -> dict[tuple[str, str], int]:
        """(kind, node id) -> number of device slots used there: one placement group each."""
        used: dict[tuple[str, str], int] = {}
        for role in self.roles.values():
            for slot in role.slots:
                key = (role.kind, slot.node_id)
                used[key] = max(used.get(key, 0), slot.index + 1)
        return used

    def bundles(self) -> dict[tuple[str, str], list[int]]:
        """(kind, node id) -> the device count of each bundle of its placement group: one per
        device, one per engine for the devices of an engine."""
        first_of: dict[tuple[str, str, int], int] = {}  # an engine's device -> its first device
        for role in self.roles.values():
            for rank in range(role.world_size):
                held = role.worker_slots(rank)
                for slot in held:
                    first_of[(role.kind, slot.node_id, slot.index)] = held[0].index
        out: dict[tuple[str, str], list[int]] = {}
        for (kind, node_id), count in self.groups().items():
            firsts = [first_of.get((kind, node_id, i), i) for i in range(count)]
            out[(kind, node_id)] = [firsts.count(i) for i in range(count) if firsts[i] == i]
        return out

    def bundle_index(self, role: str, rank: int) -> int:
        """The bundle of the worker at `rank` of `role` in its (kind, node) placement group."""
        placement = self.roles[role]
        first = placement.worker_slots(rank)[0]
        sizes = self.bundles()[(placement.kind, first.node_id)]
        starts = [sum(sizes[:b]) for b in range(len(sizes))]
        return starts.index(first.index)

    def colocated(self, role_a: str, role_b: str) -> bool:
        """Whether every device of one role is also a device of the other (same kind): weight
        sync between them can stay on the device."""
        a, b = self.roles[role_a], self.roles[role_b]
        return a.kind == b.kind and (set(a.slots) <= set(b.slots) or set(b.slots) <= set(a.slots))

    def format(self) -> str:
        """The device map: one row per role and node; an engine's devices joined by `+`."""
        rows = [
            (
                "role",
                "kind",
                "devices",
                "node",
                "device ids",
                "workers",
                "share",
                "colocated with",
                "simulated",
            )
        ]
        for role in self.roles.values():
            for node_id in role.node_ids:
                ranks = [r for r, slot in enumerate(role.slots) if slot.node_id == node_id]
                workers = [w for w in range(role.world_size) if role.worker_slots(w)[0].node_id == node_id]
                engines = ["+".join(str(s.index) for s in role.worker_slots(w)) for w in workers]
                size = role.engine_size
                rows.append(
                    (
                        role.role,
                        role.kind,
                        str(len(ranks)),
                        role.slots[ranks[0]].node_name,
                        ",".join(engines),
                        f"{len(workers)} x {size} devices" if size > 1 else str(len(workers)),
                        "/".join(sorted({f"{role.shares[r]:g}" for r in ranks})),
                        role.colocate_with or "-",
                        _simulated_note(role),
                    )
                )
        return format_table(rows)


def _simulated_note(role: RolePlan) -> str:
    return f"yes (computes on {compute_kind(role.kind, True)})" if role.simulated else "no"


def compute_kind(kind: str, simulated: bool) -> str:
    """The platform (`ROLL_DEVICE` value) a worker of `kind` computes with: the kind itself on a
    real node; on a simulated node the kind's simulation where its platform has one (the
    simulated NPU for `npu`), else the host."""
    if not simulated:
        return kind
    return get_platform(kind).simulated_kind or HOST_KIND


def build_plan(
    roles: Mapping[str, RoleSettings],
    inventory: Inventory,
    cpu_per_worker: float,
    engine_sizes: Mapping[str, int] | None = None,
) -> Plan:
    """Place every role of `roles` (the `roles` section, by role name) on `inventory`;
    `engine_sizes`: the devices each worker of a role holds (1 where not given)."""
    check_colocation(roles)
    sizes = {name: (engine_sizes or {}).get(name, 1) for name in roles}
    _check_engine_sizes(roles, sizes)
    owners = {name: owner(name, roles) for name in roles}
    kinds = {name: _kind(roles[name].device, inventory) for name in roles if owners[name] == name}
    for name, spec in roles.items():
        if owners[name] != name:
            kinds[name] = _colocated_kind(name, spec, kinds[owners[name]])

    placer = _Placer(inventory, kinds, cpu_per_worker)
    slots: dict[str, tuple[Slot, ...]] = {}
    owning = [name for name in roles if owners[name] == name]
    for name in sorted(owning, key=lambda n: -roles[n].num_devices):
        slots[name] = placer.allocate(name, roles[name].num_devices, sizes[name])
    for name, spec in roles.items():
        if owners[name] != name:
            have = slots[owners[name]]
            if spec.num_devices > len(have):
                raise PlanError(
                    f"role '{name}' wants {spec.num_devices} {kinds[name]} device(s) colocated with "
                    f"'{spec.colocate_with}', which has {len(have)} available to share: set "
                    f"roles.{name}.num_devices to at most {len(have)}"
                )
            slots[name] = have[: spec.num_devices]

    sharing: dict[Slot, int] = {}
    for role_slots in slots.values():
        for slot in role_slots:
            sharing[slot] = sharing.get(slot, 0) + 1
    placed = {}
    for name, spec in roles.items():
        kind = kinds[name]
        simulated = kind != HOST_KIND and any(inventory.node(s.node_id).simulated for s in slots[name])
        placed[name] = RolePlan(
            role=name,
            kind=kind,
            num_devices=spec.num_devices,
            colocate_with=spec.colocate_with,
            slots=slots[name],
            shares=tuple(share_of(sharing[s]) for s in slots[name]),
            simulated=simulated,
            engine_size=sizes[name],
        )
    return Plan(roles=placed, inventory=inventory, cpu_per_worker=float(cpu_per_worker))


def _check_engine_sizes(roles: Mapping[str, RoleSettings], sizes: Mapping[str, int]) -> None:
    """A role of several devices per worker needs a multiple of them, and shares no devices."""
    for name, size in sizes.items():
        if size == 1:
            continue
        spec = roles[name]
        if spec.num_devices % size:
            raise PlanError(
                f"roles.{name}.num_devices={spec.num_devices} is not a multiple of the {size} devices of "
                f"one engine (rollout.tensor_parallel_size): set it to engines x {size}"
            )
        if spec.colocate_with is not None or any(s.colocate_with == name for s in roles.values()):
            raise PlanError(
                f"role '{name}' runs engines of {size} devices, which share no devices with another role "
                f"yet: set roles.{name}.colocate_with=null (and no role colocated with it), or "
                "rollout.tensor_parallel_size=1"
            )


def share_of(sharers: int) -> float:
    """The fraction of a device each of `sharers` workers requests, rounded down to Ray's step."""
    return round_down(1.0 / sharers)


def round_down(amount: float) -> float:
    """`amount` rounded down to Ray's resource step (4 decimal places)."""
    return round(math.floor(amount / RAY_RESOURCE_STEP + 1e-9) * RAY_RESOURCE_STEP, 4)


def _kind(device: str, inventory: Inventory) -> str:
    if device != AUTO:
        return device
    kinds = inventory.accelerator_kinds()
    return max(kinds, key=inventory.total) if kinds else HOST_KIND


def _colocated_kind(name: str, spec: RoleSettings, owner_kind: str) -> str:
    if spec.device in (AUTO, owner_kind):
        return owner_kind
    raise PlanError(
        f"role '{name}' wants {spec.num_devices} {spec.device} device(s) colocated with "
        f"'{spec.colocate_with}', which runs on {owner_kind} (available {spec.device} devices to "
        f"share: 0): a role shares only devices of its own kind; set roles.{name}.device="
        f"{owner_kind} (or {AUTO}), or roles.{name}.colocate_with=null"
    )


class _Placer:
    """Hands out free device slots of each kind, node by node, and explains what does not fit."""

    def __init__(self, inventory: Inventory, kinds: dict[str, str], cpu_per_worker: float) -> None:
        self.inventory = inventory
        self.kinds = kinds
        self.cpu_per_worker = cpu_per_worker
        self.used: dict[tuple[str, str], int] = {}
        self.placed: dict[str, int] = {}

    def capacity(self, node: NodeInfo, kind: str) -> int:
        if kind == HOST_KIND:
            return math.floor(node.cpus / self.cpu_per_worker + 1e-9)
        return node.count(kind)

    def free(self, node: NodeInfo, kind: str) -> int:
        return self.capacity(node, kind) - self.used.get((kind, node.node_id), 0)

    def allocate(self, role: str, wanted: int, unit: int = 1) -> tuple[Slot, ...]:
        """`wanted` free devices of the role's kind, `unit` at a time on one node."""
        kind = self.kinds[role]
        nodes = self.inventory.nodes
        largest = max((self.capacity(n, kind) for n in nodes), default=0)
        if unit > 1 and 0 < largest < unit:
            raise PlanError(
                f"role '{role}' runs engines of {unit} {kind} devices, but no node of this cluster has "
                f"more than {largest} (cluster: {self.inventory.describe()}): an engine's devices are on "
                f"one node; lower rollout.tensor_parallel_size to {largest} or less"
            )
        available = sum(self.free(n, kind) // unit * unit for n in nodes)
        if available < wanted:
            raise PlanError(self._not_enough(role, wanted, kind, available))
        # Fewest nodes first; CPU roles keep off accelerator nodes while they can.
        order = sorted(nodes, key=lambda n: (kind == HOST_KIND and bool(n.devices), -self.free(n, kind)))
        slots: list[Slot] = []
        for node in order:
            key = (kind, node.node_id)
            while self.free(node, kind) >= unit and len(slots) < wanted:
                for _ in range(unit):
                    slots.append(Slot(node.node_id, node.name, self.used.get(key, 0)))
                    self.used[key] = self.used.get(key, 0) + 1
        self.placed[role] = len(slots)
        return tuple(slots)

    def _not_enough(self, role: str, wanted: int, kind: str, available: int) -> str:
        inventory = self.inventory
        total = sum(self.capacity(n, kind) for n in inventory.nodes)
        wants = f"role '{role}' wants {wanted} {kind} device(s)"
        if total == 0:
            present = inventory.accelerator_kinds() + [HOST_KIND]
            return (
                f"{wants}, but no node of this cluster has {kind} devices (available: 0; cluster: "
                f"{inventory.describe()}): set roles.{role}.device to one of "
                f"{', '.join(present)}, or add {kind} nodes"
            )
        unit = f" ({self.cpu_per_worker:g} CPU per worker slot)" if kind == HOST_KIND else ""
        taken = [f"{n} for {r}" for r, n in self.placed.items() if self.kinds[r] == kind]
        after = f" after {', '.join(taken)} planned for other roles" if taken else ""
        return (
            f"{wants}, but only {available} of the cluster's {total}{unit} are available{after} "
            f"(cluster: {inventory.describe()}): lower roles.{role}.num_devices or colocate "
            f"the role with another {kind} role"
        )
