"""Process groups of their own for weight sync, over a platform's backend.

The trainer's rank 0 and the rollout workers form a group that is not the default group: the
trainer may already have a default group (its data-parallel world) and the rollout workers have
another. `new_group` builds one from the sync's control store with any backend torch knows by
name (gloo, the platform's `dist_backend`, or a registered plugin such as hccl), for the process
it runs in, without touching the default group.

It uses torch's internal `_new_process_group_helper` (as `init_process_group` does), because no
public API builds a group outside the default world; `close_group` destroys it with the public
`destroy_process_group`. While it runs, the default group's bound
device is hidden: otherwise a backend that can split communicators would try to split the new
group from the trainer's world, which the rollout workers are not part of.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from roll_device.comm.control import Control

_names = itertools.count()


def new_group(
    control: Control, backend: str, rank: int, world_size: int, device: torch.device
) -> dist.ProcessGroup:
    """A `world_size` group over `backend` in which this process is `rank`; every member calls it.

    A first broadcast on `device` connects the group, so failures surface here, not mid-sync.
    """
    name = f"roll_device_weight_sync_{control.endpoint.port}_{next(_names)}"
    default = c10d._world.default_pg
    bound = default.bound_device_id if default is not None else None
    if bound is not None:
        default.bound_device_id = None
    try:
        group, _store = c10d._new_process_group_helper(
            world_size,
            rank,
            [],
            backend,
            control.store,
            group_name=name,
            timeout=timedelta(seconds=control.timeout_s),
        )
    finally:
        if bound is not None:
            default.bound_device_id = bound
    # Ranks of this group by themselves, as `init_process_group` records them: it lets
    # `destroy_process_group` forget the group (torch's registry would otherwise keep it until
    # interpreter exit, whose teardown order can abort the process).
    c10d._world.pg_group_ranks[group] = {r: r for r in range(world_size)}
    handshake(group, device)
    return group


MESSAGE_BYTES = 16 << 20  # default largest broadcast message: gloo moves 16 MiB ones fastest


def broadcast(group: dist.ProcessGroup, tensor: torch.Tensor) -> dist.Work:
    """Start a broadcast of `tensor` from rank 0 of `group`; wait on the returned work."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return group.broadcast([tensor], options)


def broadcast_bytes(group: dist.ProcessGroup, data: torch.Tensor, message: int) -> list[dist.Work]:
    """Start broadcasts of a flat uint8 tensor from rank 0 in messages of at most `message` bytes
    (every member cuts it the same way); wait on every returned work."""
    return [broadcast(group, data[start : start + message]) for start in range(0, data.numel(), message)]


def handshake(group: dist.ProcessGroup, device: torch.device) -> None:
    """One small broadcast: every member has joined (and is still there)."""
    broadcast(group, torch.zeros(1, device=device)).wait()


def close_group(group: dist.ProcessGroup, device: torch.device) -> None:
    """Close `group` on every member together (a handshake first, so no peer is mid-collective)."""
    handshake(group, device)
    dist.destroy_process_group(group)
