"""`platform.runtime`: the kind's runtime and collective library reached directly, beyond torch's
lazy start: the runtime brought up now instead of at its first use (before forking workers), and a
communicator over the kind's collective library outside torch.distributed's default group (what a
PyNccl / PyHccl communicator gives a trainer and its rollout workers; `communicator.py`).
"""

from __future__ import annotations

from roll_device.platforms.communicator import DeviceCommunicator, connect
from roll_device.platforms.groups import PlatformGroup


class Runtime(PlatformGroup):
    """The runtime group; the CPU names a subclass (its runtime needs no start)."""

    attribute = "runtime"

    def init(self) -> None:
        """Initialise the device runtime now instead of at its first use (before forking workers)."""
        self._call("init", "init")

    def device_communicator(
        self, host: str, port: int, rank: int, world_size: int, timeout_s: float = 600.0
    ) -> DeviceCommunicator:
        """A communicator of `world_size` processes over this kind's collective library: rank 0
        listens on host:port, the others connect; each member uses its current device. Every
        member calls it; it returns once all have joined."""
        platform = self.platform
        if not 0 <= rank < world_size:
            raise ValueError(f"platform '{platform.name}': rank {rank} is not in a group of {world_size}")
        platform.device_module()  # loads the kind's package, which registers its backend with torch
        return connect(host, port, rank, world_size, platform.dist_backend, platform.device(), timeout_s)
