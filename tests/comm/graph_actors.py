"""Actors the Ray Compiled Graph and direct-transport tests start (imported by Ray's workers, so
kept in a module). Each computes on its process's platform: the simulated NPU where the actor was
started with ROLL_DEVICE=npu-sim, the CPU otherwise."""

from __future__ import annotations

import time

import torch
from torch.distributed import distributed_c10d as c10d

import roll_device as rd
from roll_device.comm.ray_graphs.communicator import PlatformCommunicator

# Actor options for a simulated NPU: one of the NPUs the local Ray instance declares.
SIM_NPU = {"resources": {"NPU": 1}, "num_cpus": 0, "runtime_env": {"env_vars": {"ROLL_DEVICE": "npu-sim"}}}


class GraphActor:
    """Makes, passes on and checks tensors on its device; reports what its communicators carried."""

    def __init__(self, register: bool = True) -> None:
        self.platform = rd.current_platform()
        self.registered = rd.register_ray_communicator() if register else None

    def make(self, step: int, numel: int = 1024) -> torch.Tensor:
        """A tensor on this actor's device whose values depend on `step`."""
        return torch.arange(numel, dtype=torch.float32, device=self.platform.device()) + step

    def check(self, tensor: torch.Tensor, step: int) -> tuple[str, float]:
        """The device the tensor arrived on, and its largest difference from `make(step)`."""
        expected = torch.arange(tensor.numel(), dtype=torch.float32) + step
        return str(tensor.device), float((tensor.cpu() - expected).abs().max())

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host-staged tensor moved onto this actor's device (a mixed graph's receiving end)."""
        return tensor.to(self.platform.device())

    def report(self, tensor: torch.Tensor) -> tuple[str, list[float]]:
        return str(tensor.device), tensor.cpu().tolist()

    def stats(self) -> list[dict]:
        """What each Compiled Graph communicator in this process carried."""
        from ray.experimental.channel import ChannelContext

        return [c.stats() for c in ChannelContext.get_current().communicators.values()]

    def group_stats(self, name: str) -> dict:
        """What this actor's member of the `ray.util.collective` group `name` sent and received."""
        from ray.util.collective.collective import get_group_handle

        return get_group_handle(name).stats()

    def group_collectives(self, name: str, rank: int) -> dict:
        """Each collective of `ray.util.collective` on the group `name`, with this rank's input
        [rank, rank+1] on this actor's device; the values each gave (two ranks)."""
        from ray.util import collective

        def mine() -> torch.Tensor:
            return torch.tensor([float(rank), float(rank + 1)], device=self.platform.device())

        out = {}
        reduced = mine()
        collective.allreduce(reduced, name)
        out["allreduce"] = reduced.cpu().tolist()
        gathered = [torch.empty(2, device=self.platform.device()) for _ in range(2)]
        collective.allgather(gathered, mine(), name)
        out["allgather"] = [t.cpu().tolist() for t in gathered]
        scattered = torch.empty(1, device=self.platform.device())
        collective.reducescatter(scattered, [mine()[:1], mine()[1:]], name)
        out["reducescatter"] = scattered.cpu().tolist()
        broadcast = mine()
        collective.broadcast(broadcast, 1, name)
        out["broadcast"] = broadcast.cpu().tolist()
        collective.barrier(name)
        return out

    def read_turn(self) -> tuple[float, float]:
        """Seconds per turn of this process's Compiled Graph reads, and Ray's whole wait."""
        from ray.dag import DAGContext

        context = DAGContext.get_current()
        return context.read_iteration_timeout, context.get_timeout

    def process_groups(self) -> int:
        """How many process groups this process holds."""
        return len(c10d._world.pg_map)


class PausingCommunicator(PlatformCommunicator):
    """A test stand-in for a sender that is preempted right after its tensor went out: Ray writes
    the rest of the value (through shared memory) `pause_s` later. Everything else is the real
    communicator."""

    pause_s = 0.5  # five of Ray's 0.1 s read turns

    def send(self, value: torch.Tensor, peer_rank: int) -> None:
        super().send(value, peer_rank)
        time.sleep(self.pause_s)
