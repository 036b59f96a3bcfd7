"""`PlatformCommunicator`: Ray's Compiled Graph `Communicator` on any platform with a collective
backend (hccl on Ascend NPUs, nccl on CUDA and ROCm GPUs, a plugin's), built on the platform
layer: a process group of the platform's `dist_backend`, the platform's streams and device.

Ray makes one in each actor of a graph in two ways, and both work:
- registered for the actor's kind (`roll_device.register_ray_communicator()`, then
  `with_tensor_transport(transport="accelerator")` or a collective with no transport): Ray calls
  the class with `(world_size, comm_id, rank, actor_handles, stream, use_communication_streams)`;
- made on the driver for given actors (`PlatformCommunicator.for_actors(actors)`, then
  `with_tensor_transport(transport=communicator)` or a collective's `transport=`): Ray sends the
  instance to each actor and calls `initialize(rank)` there. Ray destroys only the communicators
  it made, so the driver calls `close()` after the graph's teardown.

Ranks follow the order of `actor_handles`. The group forms through `rendezvous.join_group` (Ray's
key-value store names rank 0's store), never touches an actor's default group, and is destroyed by
`destroy()` (which Ray calls once per channel and once per communicator: it is idempotent and
local). `stats()` counts what this communicator carried, so that a test can prove the tensors
went through it and not through Ray's host channels.

Joining also lengthens this actor's input reads to Ray's whole wait (`whole_value_reads`): Ray 2.60
reads a task's inputs in turns of `read_iteration_timeout` (0.1 s), and a turn that ends after a
tensor came through the communicator but before the rest of its value came through shared memory
starts that input over: the actor waits for the next tensor (the graph hangs) or pairs one
execution's tensors with the next one's value (ray-project/ray#59913). A sender preempted for
0.1 s between its two writes is enough; it hung a graph here on two loaded cores.
"""

from __future__ import annotations

import uuid
from typing import Any

import torch
from ray.experimental.channel.communicator import Communicator, TorchTensorAllocator
from ray.experimental.util.types import ReduceOp

from roll_device.comm.ray_graphs.backend import GroupOps, collective_platform
from roll_device.comm.ray_graphs.rendezvous import join_group
from roll_device.errors import CommunicatorError
from roll_device.platforms import Platform

TRANSPORT = "accelerator"  # what Ray calls a communicator that moves device tensors itself
KEY_PREFIX = "graph_communicator/"


class StreamContext:
    """A platform stream as the reusable context manager Ray enters around each read and write
    (two contexts are equal when they hold the same stream: Ray compares a task's input streams)."""

    def __init__(self, platform: Platform, stream: Any) -> None:
        self.platform, self.stream = platform, stream
        self._entered: list = []

    def __enter__(self) -> None:
        entered = self.platform.stream(self.stream)
        entered.__enter__()
        self._entered.append(entered)

    def __exit__(self, *exc) -> bool:
        return bool(self._entered.pop().__exit__(*exc))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StreamContext) and other.stream is self.stream

    def __hash__(self) -> int:
        return id(self.stream)

    def synchronize(self) -> None:
        self.stream.synchronize()


class PlatformCommunicator(Communicator):
    """A Compiled Graph communicator over this process's platform; see the module docstring."""

    def __init__(
        self,
        world_size: int,
        comm_id: str,
        rank: int | None = None,
        actor_handles: list | None = None,
        stream: Any = None,
        use_communication_streams: bool = False,
    ) -> None:
        self._world_size = world_size
        self._comm_id = comm_id
        self._actor_handles = list(actor_handles or [])
        self._stream = stream
        self._use_communication_streams = use_communication_streams
        self._rank: int | None = None
        self._ops: GroupOps | None = None
        self._destroyed = False
        self._counts = {"sent": 0, "received": 0, "sent_bytes": 0, "received_bytes": 0, "collectives": 0}
        if rank is not None:
            self.initialize(rank)

    @classmethod
    def for_actors(cls, actors: list, use_communication_streams: bool = False) -> PlatformCommunicator:
        """A communicator for `actors` (ranks in that order), made on the driver, for
        `with_tensor_transport(transport=...)` and collectives' `transport=`."""
        return cls(len(actors), cls.generate_communicator_id(), None, actors, None, use_communication_streams)

    def __getstate__(self) -> dict:
        """What travels to the actors: who is in the group, not this process's group or streams."""
        state = dict(self.__dict__)
        state.update(_rank=None, _ops=None, _control=None, _platform=None, _send=None, _recv=None)
        return state

    # ---- membership ------------------------------------------------------------------------
    def initialize(self, rank: int) -> None:
        self._platform = collective_platform()
        self._control, group = join_group(KEY_PREFIX + self._comm_id, rank, self._world_size, self._platform)
        self._rank = rank
        self._ops = GroupOps(group, rank, self._world_size)
        if self._use_communication_streams:
            send, recv = self._platform.new_stream(), self._platform.new_stream()
        else:
            send = recv = self._stream if self._stream is not None else self._platform.current_stream()
        self._send = StreamContext(self._platform, send)
        self._recv = StreamContext(self._platform, recv)
        whole_value_reads()

    def get_actor_handles(self) -> list:
        return self._actor_handles

    def get_rank(self, actor) -> int:
        ids = [a._ray_actor_id for a in self._actor_handles]
        if actor._ray_actor_id not in ids:
            raise CommunicatorError(f"actor {actor} is not in communicator {self._comm_id}")
        return ids.index(actor._ray_actor_id)

    def get_self_rank(self) -> int | None:
        return self._rank

    def get_world_size(self) -> int:
        return self._world_size

    def get_transport_name(self) -> str:
        return TRANSPORT

    @classmethod
    def generate_communicator_id(cls) -> str:
        return str(uuid.uuid4())

    def _group(self) -> GroupOps:
        if self._destroyed or self._ops is None:
            from ray.exceptions import RayChannelError

            state = "destroyed" if self._destroyed else "not initialized"
            raise RayChannelError(f"communicator {self._comm_id} is {state} in this actor")
        return self._ops

    # ---- point to point --------------------------------------------------------------------
    @property
    def send_stream(self) -> StreamContext:
        return self._send

    @property
    def recv_stream(self) -> StreamContext:
        return self._recv

    def send(self, value: torch.Tensor, peer_rank: int) -> None:
        group = self._group()
        with self._send:
            group.send(value, peer_rank)
        self._count("sent", value)

    def recv(
        self,
        shape: tuple[int],
        dtype: torch.dtype,
        peer_rank: int,
        allocator: TorchTensorAllocator | None = None,
    ) -> torch.Tensor:
        group = self._group()
        with self._recv:
            buffer = (
                allocator(shape, dtype)
                if allocator is not None
                else torch.empty(shape, dtype=dtype, device=self._platform.device())
            )
            group.recv(buffer, peer_rank)
        self._recv.synchronize()  # Ray reads the buffer from any stream once this returns
        self._count("received", buffer)
        return buffer

    def _count(self, what: str, tensor: torch.Tensor) -> None:
        self._counts[what] += 1
        self._counts[what + "_bytes"] += tensor.numel() * tensor.element_size()

    # ---- collectives -----------------------------------------------------------------------
    def allreduce(self, send_buf: torch.Tensor, recv_buf: torch.Tensor, op: ReduceOp = ReduceOp.SUM) -> None:
        group = self._group()
        if recv_buf is not send_buf:
            recv_buf.copy_(send_buf)
        group.allreduce(recv_buf, op)
        self._counts["collectives"] += 1

    def allgather(self, send_buf: torch.Tensor, recv_buf: torch.Tensor) -> None:
        self._group().allgather(send_buf, recv_buf)
        self._counts["collectives"] += 1

    def reducescatter(
        self, send_buf: torch.Tensor, recv_buf: torch.Tensor, op: ReduceOp = ReduceOp.SUM
    ) -> None:
        self._group().reducescatter(send_buf, recv_buf, op)
        self._counts["collectives"] += 1

    # ---- teardown and counts ---------------------------------------------------------------
    def destroy(self) -> None:
        if self._destroyed or self._ops is None:
            return
        self._destroyed = True
        self._ops.destroy()
        self._control.close()
        self._control = None

    def close(self) -> None:
        """From the driver, after the graph's teardown: destroy this communicator in each of its
        actors (Ray destroys the communicators it made itself, not one it was handed)."""
        import ray

        ray.get(
            [actor.__ray_call__.remote(_destroy_in_actor, self._comm_id) for actor in self._actor_handles]
        )

    def stats(self) -> dict:
        """What this communicator carried in this actor (tensors and bytes each way, collectives),
        its platform and whether it is still open."""
        platform = getattr(self, "_platform", None)
        return {
            **self._counts,
            "rank": self._rank,
            "platform": platform.name if platform is not None else None,
            "open": self._ops is not None and not self._destroyed,
        }


def whole_value_reads() -> None:
    """Make this process's Compiled Graph reads wait up to Ray's whole wait (`get_timeout`) per
    turn: a turn then ends halfway through a value only when its sender stalls that long between
    the two writes (module docstring). The price: an actor that reads several inputs notices an
    upstream error within one turn instead of 0.1 s."""
    from ray.dag import DAGContext

    context = DAGContext.get_current()
    context.read_iteration_timeout = max(context.read_iteration_timeout, context.get_timeout)


def _destroy_in_actor(actor, comm_id: str) -> None:
    from ray.experimental.channel import ChannelContext

    for communicator in ChannelContext.get_current().communicators.values():
        if isinstance(communicator, PlatformCommunicator) and communicator._comm_id == comm_id:
            communicator.destroy()
