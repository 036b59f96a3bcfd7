"""What the Ray cluster has: its alive nodes and, per node, CPUs and devices counted by kind.

A node's Ray resources name devices by Ray's key (`GPU`, `NPU`, a plugin's key); the platform
registry turns a key into a kind (`ray_resource` of each platform). Where several kinds share one
key (NVIDIA and AMD GPUs are both `GPU`), the node's accelerator type (resource
`accelerator_type:<type>` or label `ray.io/accelerator-type`) picks the kind whose
`ray_accelerator_type_prefixes` match it; a node with no matching type gets the kind without
prefixes (the first in detection order).

Nodes of the simulated cluster carry the label `roll-device/simulated=true`: their accelerators
are declared, not real. The host kind (`HOST_KIND`, the CPU) has no Ray resource of its own: every
node has CPUs.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, replace

from roll_device.platforms import current_platform, get_platform, known_kinds

SIMULATED_LABEL = "roll-device/simulated"
ACCELERATOR_TYPE_RESOURCE = "accelerator_type:"
ACCELERATOR_TYPE_LABEL = "ray.io/accelerator-type"
HEAD_RESOURCE = "node:__internal_head__"
CPU_RESOURCE = "CPU"


def kinds_by_resource() -> dict[str, list[str]]:
    """Ray resource key -> the kinds that count it, in detection order."""
    found: dict[str, list[str]] = {}
    for kind in known_kinds():
        resource = get_platform(kind).ray_resource
        if resource is not None:
            found.setdefault(resource, []).append(kind)
    return found


def kind_of(resource: str, accelerator_type: str | None, by_resource: dict[str, list[str]]) -> str:
    """The kind of a node's `resource` devices given the node's accelerator type."""
    candidates = by_resource[resource]
    for kind in candidates:
        prefixes = get_platform(kind).ray_accelerator_type_prefixes
        if accelerator_type and prefixes and accelerator_type.startswith(prefixes):
            return kind
    plain = [k for k in candidates if not get_platform(k).ray_accelerator_type_prefixes]
    return (plain or candidates)[0]


@dataclass(frozen=True)
class NodeInfo:
    """One alive Ray node: identity, CPUs, and devices by kind (accelerator kinds only)."""

    node_id: str
    ip: str
    name: str
    cpus: float
    devices: dict[str, int] = field(default_factory=dict)
    accelerator_type: str | None = None
    simulated: bool = False
    is_head: bool = False

    def count(self, kind: str) -> int:
        return self.devices.get(kind, 0)


@dataclass(frozen=True)
class Inventory:
    """The alive nodes of a cluster, head first."""

    nodes: tuple[NodeInfo, ...]

    def total(self, kind: str) -> int:
        return sum(node.count(kind) for node in self.nodes)

    def accelerator_kinds(self) -> list[str]:
        """Kinds with at least one device, in detection order."""
        return [k for k in known_kinds() if self.total(k) > 0]

    def node(self, node_id: str) -> NodeInfo:
        return next(n for n in self.nodes if n.node_id == node_id)

    def describe(self) -> str:
        """Each node's CPUs and devices on one line (for error messages)."""
        parts = [
            f"{n.name}: {n.cpus:g} CPU" + "".join(f", {c} {k}" for k, c in n.devices.items())
            for n in self.nodes
        ]
        return "; ".join(parts) if parts else "no alive nodes"

    def format(self) -> str:
        rows = [("node", "node id", "ip", "CPU", "devices", "simulated")]
        for n in self.nodes:
            devices = ", ".join(f"{k} x{c}" for k, c in n.devices.items()) or "-"
            name = f"{n.name} (head)" if n.is_head else n.name
            rows.append((name, n.node_id[:12], n.ip, f"{n.cpus:g}", devices, "yes" if n.simulated else "no"))
        return format_table(rows)


def format_table(rows: list[tuple[str, ...]]) -> str:
    """Left-aligned columns, the first row as header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def inventory_from_nodes(ray_nodes: list[dict]) -> Inventory:
    """An Inventory from `ray.nodes()` records (alive ones only)."""
    by_resource = kinds_by_resource()
    nodes = []
    for record in ray_nodes:
        if not record.get("Alive"):
            continue
        resources: dict[str, float] = record.get("Resources", {})
        labels: dict[str, str] = record.get("Labels", {}) or {}
        accelerator_type = labels.get(ACCELERATOR_TYPE_LABEL) or next(
            (
                key[len(ACCELERATOR_TYPE_RESOURCE) :]
                for key in resources
                if key.startswith(ACCELERATOR_TYPE_RESOURCE)
            ),
            None,
        )
        devices: dict[str, int] = {}
        for resource in by_resource:
            count = int(resources.get(resource, 0))
            if count > 0:
                kind = kind_of(resource, accelerator_type, by_resource)
                devices[kind] = devices.get(kind, 0) + count
        nodes.append(
            NodeInfo(
                node_id=record["NodeID"],
                ip=record.get("NodeManagerAddress", ""),
                name=record.get("NodeName") or record.get("NodeManagerAddress", ""),
                cpus=float(resources.get(CPU_RESOURCE, 0)),
                devices=devices,
                accelerator_type=accelerator_type,
                simulated=labels.get(SIMULATED_LABEL) == "true",
                is_head=HEAD_RESOURCE in resources,
            )
        )
    nodes.sort(key=lambda n: (not n.is_head, n.name, n.node_id))
    return Inventory(tuple(_unique_names(nodes)))


def _unique_names(nodes: list[NodeInfo]) -> list[NodeInfo]:
    """Nodes sharing a name (several raylets on one host) get their id's start appended."""
    names = [n.name for n in nodes]
    return [n if names.count(n.name) == 1 else replace(n, name=f"{n.name}/{n.node_id[:6]}") for n in nodes]


def read_inventory() -> Inventory:
    """The inventory of the cluster this process is connected to (`ray.init` first)."""
    import ray

    return inventory_from_nodes(ray.nodes())


def machine_inventory(num_cpus: float | None = None) -> Inventory:
    """This machine as a one-node inventory, without Ray: its CPUs (or `num_cpus`) and the devices
    of every accelerator kind usable here (a simulation when this process runs on it)."""
    current = current_platform()
    devices = {}
    for kind in known_kinds():
        platform = current if current.kind == kind else get_platform(kind)
        if platform.ray_resource is not None and (platform.simulated or platform.is_available()):
            devices[kind] = platform.device_count()
    node = NodeInfo(
        node_id="this-machine",
        ip="127.0.0.1",
        name=socket.gethostname(),
        cpus=float(num_cpus or os.cpu_count() or 1),
        devices=devices,
        simulated=current.simulated,
        is_head=True,
    )
    return Inventory((node,))
