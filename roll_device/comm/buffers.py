"""Buffers that buckets are packed into: host staging (pinned where the platform allows) and the
two kinds of slot rings that a bucket can be handed over in without a network.

- `ShmRing`: slots in one POSIX shared-memory file (/dev/shm), mapped by the sender and by every
  receiver on the node. The file is unlinked as soon as every receiver has mapped it, so nothing
  is left behind if a process dies; its pages are touched once at creation and at attach, so a
  sync never pays page faults.
- `IpcRing`: slots in device memory, shared by the platform's IPC handles (`Platform.ipc_handle`).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import torch

from roll_device.errors import WeightSyncError
from roll_device.platforms import Platform

SHM_DIR = Path("/dev/shm")
PAGE = 4096


def host_buffer(nbytes: int, platform: Platform) -> torch.Tensor:
    """A uint8 host buffer, pinned when `platform` is a real accelerator that is present here
    (fast, asynchronous copies to and from it); plain host memory otherwise (CPU, simulations)."""
    pin = platform.device_type != "cpu" and not platform.simulated and platform.is_available()
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)


def _touch(tensor: torch.Tensor, write: bool) -> None:
    """Fault in every page of `tensor` now instead of during the first sync."""
    pages = tensor.view(-1)[::PAGE]
    if write:
        pages.zero_()
    else:
        pages.sum()


class ShmRing:
    """`slots` host buffers of `capacity` bytes in one shared-memory file."""

    def __init__(self, path: Path, capacity: int, slots: int, owner: bool) -> None:
        self.path, self.capacity, self.owner = path, capacity, owner
        self.memory = torch.from_file(str(path), shared=True, size=capacity * slots, dtype=torch.uint8)
        self._slots = [self.memory[k * capacity : (k + 1) * capacity] for k in range(slots)]

    @classmethod
    def create(cls, capacity: int, slots: int) -> ShmRing:
        if not SHM_DIR.is_dir():
            raise WeightSyncError(
                f"no {SHM_DIR} on this host: the shared-memory weight sync needs POSIX shared memory "
                "(set weight_sync.path=collective or bridge across nodes)"
            )
        path = SHM_DIR / f"roll-device-weights-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        with open(path, "wb") as f:
            f.truncate(capacity * slots)
        ring = cls(path, capacity, slots, owner=True)
        _touch(ring.memory, write=True)
        return ring

    @classmethod
    def attach(cls, descriptor: tuple[str, int, int]) -> ShmRing:
        path, capacity, slots = descriptor
        if not Path(path).exists():
            raise WeightSyncError(
                f"shared-memory file {path} is not on this host: the shared-memory path needs the "
                "receiver on the sender's node (check the placement, or use weight_sync.path=bridge "
                "with the roles on different nodes)"
            )
        ring = cls(Path(path), capacity, slots, owner=False)
        _touch(ring.memory, write=False)
        return ring

    def descriptor(self) -> tuple[str, int, int]:
        return (str(self.path), self.capacity, len(self._slots))

    def slot(self, index: int) -> torch.Tensor:
        return self._slots[index]

    def attached(self) -> None:
        """Every receiver has mapped the file: remove its name (the mappings stay valid)."""
        if self.owner:
            self.path.unlink(missing_ok=True)

    def close(self) -> None:
        self.attached()
        self._slots = []
        self.memory = None


class IpcRing:
    """`slots` device buffers of `capacity` bytes, opened by receivers through IPC handles."""

    def __init__(self, slots: list[torch.Tensor], platform: Platform) -> None:
        self._slots = slots
        self.platform = platform

    @classmethod
    def create(cls, capacity: int, slots: int, platform: Platform) -> IpcRing:
        device = platform.device()
        return cls([torch.empty(capacity, dtype=torch.uint8, device=device) for _ in range(slots)], platform)

    @classmethod
    def attach(cls, handles: list[tuple], platform: Platform) -> IpcRing:
        return cls([platform.open_ipc_handle(h) for h in handles], platform)

    def descriptor(self) -> list[tuple]:
        return [self.platform.ipc_handle(s) for s in self._slots]

    def slot(self, index: int) -> torch.Tensor:
        return self._slots[index]

    def attached(self) -> None:
        """Nothing to release: the handles stay valid while the sender holds the slots."""

    def close(self) -> None:
        self._slots = []
