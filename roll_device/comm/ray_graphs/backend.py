"""A platform's collective backend as Ray's hooks need it: the check that it exists, and the
point-to-point and collective operations on one process group of it.

`collective_platform(kind)` is the platform whose backend (`dist_backend`: hccl, nccl, gloo, a
plugin's) will carry tensors, refused with a `MissingPackageError` that names the kind, the
backend and what to install when torch.distributed cannot build that backend here. `GroupOps` runs
send, receive, all-reduce, all-gather, reduce-scatter, reduce, broadcast and barrier on a group, with
Ray's reduce operations (by name: `ray.experimental.util.types.ReduceOp` and
`ray.util.collective.types.ReduceOp` number them differently). Where a backend has no
reduce-scatter (gloo), it is an all-reduce of which each rank keeps its part.
"""

from __future__ import annotations

from enum import Enum

import torch
import torch.distributed as dist

from roll_device.errors import MissingPackageError
from roll_device.platforms import Platform, current_platform, get_platform

AVERAGE = "AVG"  # Ray's mean, which not every backend reduces natively: a sum divided here


def platform_for(kind: str | None) -> Platform:
    """The platform of `kind` in this process: the current one when `kind` is None or its kind
    (so that a simulated NPU process gets its simulated platform for its own kind)."""
    current = current_platform()
    if kind is None or kind == current.kind:
        return current
    return get_platform(kind)


def collective_platform(kind: str | None = None) -> Platform:
    """The platform of `kind` (None: this process's), checked to have its collective backend here."""
    platform = platform_for(kind)
    try:
        platform.device_module()  # loads the kind's package, which registers its backend with torch
    except MissingPackageError as exc:  # it names the package and what to install: said once
        raise MissingPackageError(f"{_no_backend(platform)}: {exc}") from exc
    if not dist.is_available() or not dist.is_backend_available(platform.dist_backend):
        raise MissingPackageError(
            f"{_no_backend(platform)}: torch.distributed cannot build it in this process; {platform.install_hint}"
        )
    return platform


def _no_backend(platform: Platform) -> str:
    return f"platform '{platform.name}' has no collective backend '{platform.dist_backend}' here"


def torch_reduce_op(op: Enum) -> dist.ReduceOp:
    """torch's reduce operation for a Ray one (SUM, PRODUCT, MIN, MAX; AVG is summed, then divided)."""
    return dist.ReduceOp.SUM if op.name == AVERAGE else getattr(dist.ReduceOp, op.name)


class GroupOps:
    """Operations on one process group in which this process is `rank` of `world_size`."""

    def __init__(self, group: dist.ProcessGroup, rank: int, world_size: int) -> None:
        self.group, self.rank, self.world_size = group, rank, world_size
        self._native_reduce_scatter = True

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        dist.send(tensor, group=self.group, group_dst=peer)

    def recv(self, tensor: torch.Tensor, peer: int) -> None:
        dist.recv(tensor, group=self.group, group_src=peer)

    def allreduce(self, tensor: torch.Tensor, op: Enum) -> None:
        """Reduce `tensor` in place across the group."""
        dist.all_reduce(tensor, op=torch_reduce_op(op), group=self.group)
        if op.name == AVERAGE:
            tensor.div_(self.world_size)

    def allgather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        """Every rank's `send`, concatenated along the first dimension in rank order, into `recv`."""
        dist.all_gather_into_tensor(recv, send.contiguous(), group=self.group)

    def reducescatter(self, send: torch.Tensor, recv: torch.Tensor, op: Enum) -> None:
        """Reduce `send` across the group; rank r keeps the r-th part (first dimension) in `recv`."""
        if self._native_reduce_scatter:
            try:
                dist.reduce_scatter_tensor(recv, send.contiguous(), op=torch_reduce_op(op), group=self.group)
                if op.name == AVERAGE:
                    recv.div_(self.world_size)
                return
            except (RuntimeError, NotImplementedError):  # gloo has none: the same on every rank
                self._native_reduce_scatter = False
        reduced = send.clone()
        self.allreduce(reduced, op)
        recv.copy_(reduced.chunk(self.world_size)[self.rank])

    def reduce(self, tensor: torch.Tensor, root: int, op: Enum) -> None:
        """Reduce `tensor` across the group into rank `root`'s (others' are left as they are)."""
        target = tensor if self.rank == root else tensor.clone()
        dist.reduce(target, group=self.group, group_dst=root, op=torch_reduce_op(op))
        if op.name == AVERAGE and self.rank == root:
            tensor.div_(self.world_size)

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        dist.broadcast(tensor, group=self.group, group_src=root)

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def destroy(self) -> None:
        """Forget the group in this process (no handshake: peers may already be gone)."""
        dist.destroy_process_group(self.group)
