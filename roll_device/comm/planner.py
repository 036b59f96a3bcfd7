"""Which path carries the trainer's weights to the rollout, from the two roles' kinds and placement.

Paths:
- `colocated`: both roles on the same devices of one node. Buckets are handed over without a
  network: device IPC handles where the platform supports them (`Platform.supports_ipc`), POSIX
  shared memory otherwise (CPU, simulated devices).
- `collective`: separate workers of one kind. A broadcast from the trainer's rank 0 to every
  rollout worker in a process group of their own, over the kind's backend (`dist_backend`).
- `bridge`: any two kinds. Buckets are staged in host memory (pinned where possible), cross
  through shared memory when both ends share a node or a gloo broadcast between nodes, and are
  loaded on the target device. A sharded sync decides this per link (`link_plan`): each trainer
  rank's link to the engine ranks of one node.
- `rdt`: separate Ray actors of one kind. Each bucket is a device tensor returned by a Ray actor
  call with a Ray Direct Transport (`rdt_transport.py`) over a collective group of the kind's
  backend, handed to every rollout actor without the object store.

`auto` picks `colocated` for colocated roles, `collective` for one kind, `bridge` for two kinds,
with one exception: for kinds whose device memory is host memory (the CPU), `bridge` on one node
(shared memory) replaces a loopback collective that is two to four times slower. A forced path that
cannot work (IPC or shared memory between nodes, a collective between two kinds) is refused with
a ConfigError before anything starts.

`auto` never picks `rdt`: benchmarks/ray_graphs.py measured an RDT bucket transfer at 0.93 of a
bare send/recv of the same bytes, and benchmarks/rdt_weight_sync.py a whole sync by `rdt` at 1.4
times the time of one by `collective` (docs/benchmarks.md), so the broadcast stays the choice for
one kind; `rdt` is there for who asks for it (`weight_sync.path=rdt`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from roll_device.comm.paths import AUTO, BRIDGE, COLLECTIVE, COLOCATED, DIRECT, check_path
from roll_device.errors import ConfigError
from roll_device.platforms import HOST_KIND, Platform, get_platform


@dataclass(frozen=True)
class SyncPlan:
    """A chosen path and how it moves bytes.

    transport: `ipc` (device buffers shared by handle), `shm` (host shared memory), `broadcast`
    (a process group over `backend`) or `rdt` (Ray Direct Transport over a group of `backend`); `staging`: where buckets are packed, `device` or `host`.
    """

    path: str
    transport: str
    backend: str | None
    staging: str
    src_kind: str
    dst_kind: str
    simulated: bool = False

    def describe(self) -> str:
        how = {
            "ipc": "device IPC handles",
            "shm": "host shared memory",
            "broadcast": f"{self.backend} broadcast",
            "rdt": f"Ray Direct Transport over {self.backend}",
        }[self.transport]
        label = " [simulated device]" if self.simulated else ""
        return f"{self.path}: {self.src_kind} -> {self.dst_kind} via {how} ({self.staging} buckets){label}"


def _platform(kind: str | Platform) -> Platform:
    return kind if isinstance(kind, Platform) else get_platform(kind)


def plan_sync(
    src: str | Platform,
    dst: str | Platform,
    *,
    colocated: bool,
    same_node: bool,
    forced: str = AUTO,
) -> SyncPlan:
    """The plan for syncing from a trainer on `src` to rollout workers on `dst` (kinds or platforms).

    `colocated`: the rollout shares the trainer's devices; `same_node`: every rollout worker is on
    the trainer's rank-0 node; `forced`: `auto` or a path name (`weight_sync.path`).
    """
    src_p, dst_p = _platform(src), _platform(dst)
    same_kind = src_p.kind == dst_p.kind
    pair = f"{src_p.name} trainer -> {dst_p.name} rollout"
    check_path(forced)
    if colocated and not same_node:
        raise ConfigError(f"{pair}: colocated roles share devices, so they must be on one node")
    if colocated and not same_kind:
        raise ConfigError(
            f"{pair}: roles on two kinds cannot share devices: drop colocate_with or use one kind"
        )
    path = forced if forced != AUTO else _auto_path(src_p, same_kind, colocated, same_node)
    ends = {"src_kind": src_p.kind, "dst_kind": dst_p.kind, "simulated": src_p.simulated or dst_p.simulated}
    if path == COLOCATED:
        if not same_node:
            raise ConfigError(
                f"weight_sync.path=colocated for {pair} on different nodes: IPC handles and shared "
                "memory work within one node; use bridge (or auto)"
            )
        if not same_kind:
            raise ConfigError(
                f"weight_sync.path=colocated for {pair}: device handles cannot cross kinds; "
                "use bridge (or auto)"
            )
        transport = "ipc" if src_p.supports_ipc and not src_p.simulated else "shm"
        staging = "device" if transport == "ipc" else "host"
        return SyncPlan(path, transport, None, staging, **ends)
    if path in (COLLECTIVE, DIRECT):
        if not same_kind:
            raise ConfigError(
                f"weight_sync.path={path} for {pair}: one collective backend cannot join two "
                f"kinds ({src_p.dist_backend} vs {dst_p.dist_backend}); use bridge (or auto)"
            )
        transport = "broadcast" if path == COLLECTIVE else "rdt"
        return SyncPlan(path, transport, src_p.dist_backend, "device", **ends)
    return link_plan(SyncPlan(path, "shm", None, "host", **ends), same_node)


def link_plan(plan: SyncPlan, same_node: bool) -> SyncPlan:
    """The plan of one link of a sync between ends on one node (`same_node`) or two: a bridge's
    link is shared memory on one host and a gloo broadcast between hosts; other paths move bytes
    one way wherever their ends are."""
    if plan.path != BRIDGE:
        return plan
    if same_node:
        return replace(plan, transport="shm", backend=None)
    return replace(plan, transport="broadcast", backend=get_platform(HOST_KIND).dist_backend)


def _auto_path(src: Platform, same_kind: bool, colocated: bool, same_node: bool) -> str:
    if colocated:
        return COLOCATED
    if not same_kind:
        return BRIDGE
    if src.device_type == get_platform(HOST_KIND).device_type and same_node:
        return BRIDGE
    return COLLECTIVE
