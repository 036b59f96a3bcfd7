"""A device communicator outside torch.distributed's default group: what vLLM's PyNccl (PyHccl on
Ascend) communicator over a `StatelessProcessGroup` gives a trainer and its rollout workers, which
are not one torch.distributed world, built on the kind's own collective backend
(`Platform.dist_backend`: nccl, hccl, gloo) instead of a second binding of the library.

`new_process_group` builds a group from any store with a backend torch knows by name, for the
process it runs in, without touching the default group (the weight sync's groups use it too). It
uses torch's internal `_new_process_group_helper`, as `init_process_group` does, because no public
API builds a group outside the default world. While it runs the default group's bound device is
hidden: otherwise a backend that can split communicators would try to split the new group from
the process's world, which the other members are not part of.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

# groups made per label in this process: the members of one group count alike (they share the
# label's store), whatever other groups each of them made before (a receiver with several links)
_made: Counter = Counter()


def new_process_group(
    store: dist.Store, backend: str, rank: int, world_size: int, timeout_s: float, label: str
) -> dist.ProcessGroup:
    """A `world_size` group over `backend` in which this process is `rank`; every member calls it
    with a store they share. `label` names the group (with a count of the groups made under that
    label here) in torch's registry."""
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
            store,
            group_name=f"{label}_{_made[label]}",
            timeout=timedelta(seconds=timeout_s),
        )
    finally:
        if bound is not None:
            default.bound_device_id = bound
    _made[label] += 1
    # Ranks of this group by themselves, as `init_process_group` records them: it lets
    # `destroy_process_group` forget the group (torch's registry would otherwise keep it until
    # interpreter exit, whose teardown order can abort the process).
    c10d._world.pg_group_ranks[group] = {r: r for r in range(world_size)}
    return group


class DeviceCommunicator:
    """`world_size` processes that move device tensors among themselves over one kind's collective
    backend. Every operation is collective or paired (send/recv) and returns once it completed;
    tensors live on each member's device. Made by `platform.runtime.device_communicator`."""

    def __init__(
        self, group: dist.ProcessGroup, store: dist.Store, rank: int, world_size: int, device: torch.device
    ) -> None:
        self.group, self.store = group, store  # the store stays referenced while the group lives
        self.rank, self.world_size, self.device = rank, world_size, device

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        options = dist.BroadcastOptions()
        options.rootRank = src
        self.group.broadcast([tensor], options).wait()
        return tensor

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over every member, in place."""
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.SUM
        self.group.allreduce([tensor], options).wait()
        return tensor

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.group.send([tensor], dst, 0).wait()

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        self.group.recv([tensor], src, 0).wait()
        return tensor

    def barrier(self) -> None:
        self.all_reduce(torch.zeros(1, device=self.device))

    def close(self) -> None:
        """Leave the group (every member closes it, after its last operation)."""
        dist.destroy_process_group(self.group)


def connect(
    host: str, port: int, rank: int, world_size: int, backend: str, device: torch.device, timeout_s: float
) -> DeviceCommunicator:
    """Rank 0 serves a store at host:port, the others connect; then the group forms over
    `backend` and one all-reduce on `device` proves every member joined."""
    store = dist.TCPStore(
        host, port, world_size, rank == 0, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )
    group = new_process_group(store, backend, rank, world_size, timeout_s, "roll_device_communicator")
    communicator = DeviceCommunicator(group, store, rank, world_size, device)
    communicator.barrier()
    return communicator
