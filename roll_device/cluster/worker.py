"""`RoleWorker`: the base of every Ray actor that serves a role (trainer, rollout, reward, ...).

A `WorkerGroup` starts each worker with its identity in environment variables
(`ROLL_DEVICE_WORKER_ROLE`, `_RANK`, `_WORLD_SIZE`, `_KIND`, `_SIMULATED`, `_NODE_NAME`) and with
`ROLL_DEVICE` set to the platform it computes with (`compute_kind`). On start the worker:

1. reads Ray's accelerator ids for its kind's Ray resource (`GPU`, `NPU`, ...) and the
   visible-devices variable Ray set (`CUDA_VISIBLE_DEVICES`, `ASCEND_RT_VISIBLE_DEVICES`, ...);
2. maps the id to a local device index: its position in the visible list, or the id itself when
   Ray was told not to narrow the list (`RAY_EXPERIMENTAL_NOSET_*`);
3. binds `rd.current_platform()` (its kind; on a simulated node the kind's simulation, told how
   many devices are visible, or the host for a kind without one) and sets the device;
4. starts recording the shared memory its processes hold (cluster/shm.py), which the group
   removes once the worker is gone.

Subclasses call `super().__init__()` first, then use `self.platform`, `self.device`, `self.rank`,
`self.world_size`, `self.role`. `info()` reports where the worker is and what it is bound to.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, fields
from typing import Any

import roll_device as rd
from roll_device.cluster.plan import Plan, compute_kind
from roll_device.cluster.shm import Watch, run_key, write_ledger
from roll_device.errors import ConfigError, DeviceUnavailableError
from roll_device.platforms import get_platform
from roll_device.platforms.registry import ENV_VAR

ENV_PREFIX = "ROLL_DEVICE_WORKER_"


@dataclass(frozen=True)
class WorkerSpec:
    """Who a worker is, as its group decided: passed through the worker's environment."""

    role: str
    rank: int
    world_size: int
    kind: str
    simulated: bool
    node_name: str

    def to_env(self) -> dict[str, str]:
        env = {ENV_PREFIX + f.name.upper(): str(getattr(self, f.name)) for f in fields(self)}
        env[ENV_VAR] = compute_kind(self.kind, self.simulated)
        return env

    @classmethod
    def from_env(cls) -> WorkerSpec:
        names = {f.name: ENV_PREFIX + f.name.upper() for f in fields(cls)}
        missing = [var for var in names.values() if var not in os.environ]
        if missing:
            raise ConfigError(
                f"this RoleWorker has no {', '.join(missing)}: start role workers through "
                "roll_device.cluster.WorkerGroup, which sets them"
            )
        raw = {name: os.environ[var] for name, var in names.items()}
        return cls(
            role=raw["role"],
            rank=int(raw["rank"]),
            world_size=int(raw["world_size"]),
            kind=raw["kind"],
            simulated=raw["simulated"] == "True",
            node_name=raw["node_name"],
        )


def worker_env(plan: Plan, role: str, rank: int) -> dict[str, str]:
    """The environment a worker of `role` at `rank` starts with."""
    placement = plan.roles[role]
    spec = WorkerSpec(
        role=role,
        rank=rank,
        world_size=placement.world_size,
        kind=placement.kind,
        simulated=placement.simulated,
        node_name=placement.worker_slots(rank)[0].node_name,
    )
    env = spec.to_env()
    if not placement.simulated:
        platform = get_platform(placement.kind)
        env.update({**platform.allocator_env(), **platform.collective_env()})
    return env


def local_device_index(accelerator_id: str | None, visible: str | None, visible_env: str | None) -> int:
    """Where Ray's device `accelerator_id` sits among the devices this process can see."""
    if accelerator_id is None:
        return 0
    if visible is None:  # Ray left the list alone: every device is visible, ids are indices
        return int(accelerator_id)
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if accelerator_id not in ids:
        raise DeviceUnavailableError(
            f"Ray assigned device {accelerator_id}, but {visible_env}='{visible}' hides it: do not "
            f"set {visible_env} for role workers (Ray sets it)"
        )
    return ids.index(accelerator_id)


def _watch_shared_memory(role: str) -> Watch | None:
    """Record on this node what shared memory this worker's processes hold, for the group's
    `kill()` to remove once they are gone (a killed actor runs no cleanup: cluster/shm.py)."""
    import ray

    if not ray.is_initialized():
        return None
    return Watch(on_new=write_ledger(run_key(), role)).start()


class RoleWorker:
    """Base class of role workers; see the module docstring."""

    def __init__(self) -> None:
        self.spec = WorkerSpec.from_env()
        self.role, self.rank, self.world_size = self.spec.role, self.spec.rank, self.spec.world_size
        self.kind, self.simulated = self.spec.kind, self.spec.simulated
        identity = get_platform(self.kind)
        self.accelerator_ids = identity.ray_device_ids()
        self.visible_devices_env = identity.visible_devices_env
        visible = os.environ.get(self.visible_devices_env) if self.visible_devices_env else None
        self.local_device_index = local_device_index(
            self.accelerator_ids[0] if self.accelerator_ids else None, visible, self.visible_devices_env
        )
        computes_on = get_platform(os.environ[ENV_VAR])
        if computes_on.simulated and visible is not None:
            shown = len([v for v in visible.split(",") if v.strip()])
            os.environ.update(computes_on.simulated_devices_env(shown))
        self.platform = rd.current_platform()
        self.platform.set_device(self.local_device_index if self.platform.kind == self.kind else 0)
        self.device = self.platform.device()
        self.shared_memory = _watch_shared_memory(self.role)

    def info(self) -> dict[str, Any]:
        """Where this worker runs and what it is bound to (JSON-able)."""
        import ray

        return {
            "role": self.role,
            "rank": self.rank,
            "world_size": self.world_size,
            "kind": self.kind,
            "simulated": self.simulated,
            "platform": self.platform.name,
            "device": str(self.device),
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_name": self.spec.node_name,
            "ip": ray.util.get_node_ip_address(),
            "visible_devices_env": self.visible_devices_env,
            "visible_devices": os.environ.get(self.visible_devices_env) if self.visible_devices_env else None,
            "accelerator_ids": self.accelerator_ids,
            "local_device_index": self.local_device_index,
            "pid": os.getpid(),
        }

    def get_master_addr_port(self) -> tuple[str, int]:
        """This node's address and a port free on it now: a torch.distributed rendezvous for the
        group when asked of rank 0."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port
