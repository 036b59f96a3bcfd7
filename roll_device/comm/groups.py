"""Process groups of their own for weight sync, over a platform's backend.

The trainer's rank 0 and the rollout workers form a group that is not the default group: the
trainer may already have a default group (its data-parallel world) and the rollout workers have
another. `new_group` builds one from the sync's control store with any backend torch knows by
name (gloo, the platform's `dist_backend`, or a registered plugin such as hccl), for the process
it runs in, without touching the default group.

It builds the group with the platform layer's `new_process_group` (which keeps the default group
out of it); `close_group` destroys it with the public `destroy_process_group`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from roll_device.comm.control import Control
from roll_device.platforms.communicator import new_process_group


def new_group(
    control: Control, backend: str, rank: int, world_size: int, device: torch.device
) -> dist.ProcessGroup:
    """A `world_size` group over `backend` in which this process is `rank`; every member calls it.

    A first broadcast on `device` connects the group, so failures surface here, not mid-sync.
    """
    label = f"roll_device_weight_sync_{control.endpoint.port}{control.namespace}"
    group = new_process_group(control.store, backend, rank, world_size, control.timeout_s, label)
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
