"""`PlatformCollectiveGroup`: a `ray.util.collective` backend over a platform's collective backend,
for the kinds whose backend Ray has none for (Ray ships NCCL and GLOO; Ascend's HCCL it lacks).

`register_collective_backend(kind)` registers it under the kind's backend name, upper-cased (`HCCL`)
where Ray has no backend of that name, and says which name serves the kind. It must run in the
driver and in every actor of a group (Ray looks the name up in each process); `device_group(actors,
kind)` does both and forms the group with Ray's `create_collective_group`, whose groups Ray Direct
Transport uses (`transport.py`).

In each actor the group runs on that actor's platform (`current_platform()`), in a process group of
its own formed through `rendezvous.join_group`: unlike Ray's GLOO backend, it never makes or
replaces the actor's default group. `stats()` counts the tensors it sent and received.
"""

from __future__ import annotations

import torch
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import (
    AllGatherOptions,
    AllReduceOptions,
    BarrierOptions,
    BroadcastOptions,
    RecvOptions,
    ReduceOptions,
    ReduceScatterOptions,
    SendOptions,
)

from roll_device.comm.ray_graphs.backend import GroupOps, collective_platform, platform_for
from roll_device.comm.ray_graphs.rendezvous import join_group
from roll_device.errors import MissingPackageError
from roll_device.platforms import current_platform

KEY_PREFIX = "collective_group/"


def _single(tensors: list) -> torch.Tensor:
    """The one tensor Ray's collective API wraps in a list."""
    (tensor,) = tensors
    return tensor


class PlatformCollectiveGroup(BaseGroup):
    """One actor's member of a `ray.util.collective` group on its platform's backend."""

    def __init__(self, world_size: int, rank: int, group_name: str) -> None:
        super().__init__(world_size, rank, group_name)
        platform = collective_platform()
        self._control, group = join_group(KEY_PREFIX + group_name, rank, world_size, platform)
        self._ops = GroupOps(group, rank, world_size)
        self._counts = {"sent": 0, "received": 0, "sent_bytes": 0, "received_bytes": 0}
        self.platform_name = platform.name

    @classmethod
    def backend(cls) -> str:
        return backend_name()

    @classmethod
    def check_backend_availability(cls) -> bool:
        try:
            collective_platform()
        except MissingPackageError:
            return False
        return True

    def destroy_group(self) -> None:
        self._ops.destroy()
        self._control.close()

    def stats(self) -> dict:
        """Tensors and bytes this member sent and received."""
        return dict(self._counts, platform=self.platform_name)

    def _count(self, what: str, tensor: torch.Tensor) -> None:
        self._counts[what] += 1
        self._counts[what + "_bytes"] += tensor.numel() * tensor.element_size()

    def send(self, tensor: list, send_options: SendOptions) -> None:
        self._ops.send(_single(tensor), send_options.dst_rank)
        self._count("sent", _single(tensor))

    def recv(self, tensor: list, recv_options: RecvOptions) -> None:
        self._ops.recv(_single(tensor), recv_options.src_rank)
        self._count("received", _single(tensor))

    def allreduce(self, tensor: list, allreduce_options: AllReduceOptions | None = None) -> None:
        self._ops.allreduce(_single(tensor), (allreduce_options or AllReduceOptions()).reduceOp)

    def reduce(self, tensor: list, reduce_options: ReduceOptions | None = None) -> None:
        options = reduce_options or ReduceOptions()
        self._ops.reduce(_single(tensor), options.root_rank, options.reduceOp)

    def broadcast(self, tensor: list, broadcast_options: BroadcastOptions | None = None) -> None:
        self._ops.broadcast(_single(tensor), (broadcast_options or BroadcastOptions()).root_rank)

    def barrier(self, barrier_options: BarrierOptions | None = None) -> None:
        self._ops.barrier()

    def allgather(
        self, tensor_list: list, tensor: list, allgather_options: AllGatherOptions | None = None
    ) -> None:
        """Every rank's tensor into `tensor_list[0]` (one tensor per rank, in rank order)."""
        outputs, part = _single(tensor_list), _single(tensor)
        gathered = torch.empty((self.world_size, *part.shape), dtype=part.dtype, device=part.device)
        self._ops.allgather(part.unsqueeze(0), gathered)
        for output, gathered_part in zip(outputs, gathered):
            output.copy_(gathered_part)

    def reducescatter(
        self, tensor: list, tensor_list: list, reducescatter_options: ReduceScatterOptions | None = None
    ) -> None:
        """The reduction of every rank's `tensor_list[0]`; this rank keeps part `rank` in `tensor`."""
        output, parts = _single(tensor), _single(tensor_list)
        op = (reducescatter_options or ReduceScatterOptions()).reduceOp
        self._ops.reducescatter(torch.stack(list(parts)), output.unsqueeze(0), op)


def backend_name(kind: str | None = None) -> str:
    """The `ray.util.collective` backend name that serves `kind` (None: this process's platform)."""
    platform = current_platform() if kind is None else platform_for(kind)
    return platform.dist_backend.upper()


def register_collective_backend(kind: str | None = None) -> str:
    """Register `PlatformCollectiveGroup` for `kind` (None: this process's platform) under its
    backend's name where Ray has no backend of that name; returns the name that serves the kind."""
    from ray.util.collective.backend_registry import BackendRegistry
    from ray.util.collective.backend_registry import register_collective_backend as register

    name = backend_name(kind)
    if not BackendRegistry().is_registered(name):  # the registry is a singleton
        register(name, PlatformCollectiveGroup)
    return name


def register_own_collective_backend(name: str) -> str:
    """Register `PlatformCollectiveGroup` under `name` (one subclass per name, idempotent) in this
    process, for users that need roll-device's group whatever Ray has: it never makes the
    process's default group (Ray's GLOO backend does, which an engine in the same actor owns)."""
    from ray.util.collective.backend_registry import BackendRegistry
    from ray.util.collective.backend_registry import register_collective_backend as register

    if not BackendRegistry().is_registered(name):
        group_class = type(
            f"{name.title()}Group",
            (PlatformCollectiveGroup,),
            {"backend": classmethod(lambda cls: name), "__module__": __name__},
        )
        register(name, group_class)
    return name.upper()


def device_group(actors: list, kind: str, name: str | None = None):
    """From the driver: register the backend for `kind` here and in `actors`, and form a collective
    group of them (ranks in that order) with Ray's `create_collective_group`; its handle."""
    import ray
    from ray.experimental.collective import create_collective_group

    backend = register_collective_backend(kind)
    ray.get([actor.__ray_call__.remote(_register_in_actor) for actor in actors])
    return create_collective_group(actors, backend=backend, name=name)


def _register_in_actor(actor) -> str:
    return register_collective_backend()
