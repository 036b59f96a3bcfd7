"""How Ray actors form a process group of their own: rank 0 serves a store, Ray's key-value store
tells the others where.

Rank 0 serves a TCP store on its node's address (any free port: no port is guessed ahead) and
publishes `host:port` under the group's key in Ray's internal key-value store; the other ranks wait
for the key and connect. The group (not the default one, so an actor's training world is left
alone) is then built over the platform's backend by `roll_device.comm.groups.new_group`, whose
first broadcast proves every member joined; rank 0 then deletes the key.
"""

from __future__ import annotations

import time

import torch.distributed as dist

from roll_device.comm.control import Control, Endpoint
from roll_device.comm.groups import new_group
from roll_device.errors import CommunicatorError
from roll_device.platforms import Platform

NAMESPACE = "roll_device"
POLL_S = 0.02
JOIN_TIMEOUT_S = 120.0  # how long a member waits for the others (and the group's store timeout)


def join_group(
    key: str, rank: int, world_size: int, platform: Platform, timeout_s: float = JOIN_TIMEOUT_S
) -> tuple[Control, dist.ProcessGroup]:
    """This actor's membership (as `rank`) of the `world_size` group called `key`; every member
    calls it. Returns the store connection (keep it while the group lives) and the group."""
    import ray
    from ray.experimental import internal_kv

    if rank == 0:
        control = Control.serve(ray.util.get_node_ip_address(), timeout_s)
        endpoint = control.endpoint
        internal_kv._internal_kv_put(key, f"{endpoint.host}:{endpoint.port}", namespace=NAMESPACE)
    else:
        control = Control.connect(_published(key, timeout_s), timeout_s)
    group = new_group(control, platform.dist_backend, rank, world_size, platform.device())
    if rank == 0:
        internal_kv._internal_kv_del(key, namespace=NAMESPACE)
    return control, group


def _published(key: str, timeout_s: float) -> Endpoint:
    from ray.experimental import internal_kv

    deadline = time.monotonic() + timeout_s
    while (raw := internal_kv._internal_kv_get(key, namespace=NAMESPACE)) is None:
        if time.monotonic() > deadline:
            raise CommunicatorError(
                f"process group '{key}': rank 0 did not publish its address within {timeout_s:g}s "
                "(did every actor of the group start joining it?)"
            )
        time.sleep(POLL_S)
    host, _, port = raw.decode().rpartition(":")
    return Endpoint(host, int(port))
