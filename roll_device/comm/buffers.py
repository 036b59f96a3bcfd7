"""Buffers that buckets are packed into and received in.

- `host_buffer`: host staging memory, pinned when the platform is a real accelerator here.
- `ShmSlot`: one bucket buffer in a POSIX shared-memory file (/dev/shm), mapped by the sender and
  by every receiver on the node. The sender unlinks the file as soon as every receiver has mapped
  it, so nothing is left behind if a process dies; pages are touched when the slot is made and
  mapped, so a sync never pays page faults.
- `IpcSlot`: one bucket buffer in device memory, shared through the platform's IPC handles
  (allocated inside `Platform.ipc_allocation`: on CUDA with expandable segments off).
- `storage_users`: how many tensors hold a buffer's memory. A host buffer whose tensors were
  handed to a consumer is reused only once the consumer let go of all of them.
- `HostPool`: host receive buffers of any size, reused when free, new ones made
  while a consumer holds the others. (Device buffers are never handed out: receivers copy out.)
- `own_aligned_memory(module)`: the tensors a sync lands in, each at a 64-byte boundary. A model
  that transformers loads on the host from safetensors keeps its tensors where they lie in a
  private mapping of the file, at the file's offsets (the embedding of a 0.5B-shaped model 40
  bytes past a boundary), and a bulk copy into memory off its source's alignment runs at about
  two thirds of memcpy here.
"""

from __future__ import annotations

import itertools
import os
import uuid
from pathlib import Path

import torch

from roll_device.comm.buckets import ALIGN
from roll_device.errors import WeightSyncError
from roll_device.platforms import Platform

SHM_DIR = Path("/dev/shm")
PAGE = 4096


def host_buffer(nbytes: int, platform: Platform) -> torch.Tensor:
    """A uint8 host buffer, pinned when `platform` is a real accelerator that is present here
    (fast, asynchronous copies to and from it); plain host memory otherwise (CPU, simulations)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=platform.supports_pinned_memory)


def storage_users(tensor: torch.Tensor) -> int:
    """The number of tensors (views included) that share `tensor`'s memory, plus a constant."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


def own_aligned_memory(module: torch.nn.Module) -> int:
    """Give each parameter and buffer of `module` that starts off a 64-byte boundary memory of its
    own (a copy, once; shared parameters stay shared); returns the bytes moved."""
    moved = 0
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if tensor.numel() and tensor.data_ptr() % ALIGN:
            tensor.data = tensor.data.clone()
            moved += tensor.numel() * tensor.element_size()
    return moved


def _touch(tensor: torch.Tensor, write: bool) -> None:
    """Fault in every page of `tensor` now instead of during a sync."""
    pages = tensor[::PAGE]
    if write:
        pages.zero_()
    else:
        pages.sum()


class ShmSlot:
    """A bucket buffer of `capacity` bytes in a shared-memory file."""

    def __init__(self, path: Path, capacity: int) -> None:
        self.path = path
        self.tensor = torch.from_file(str(path), shared=True, size=capacity, dtype=torch.uint8)

    @classmethod
    def create(cls, capacity: int, platform: Platform) -> ShmSlot:
        """A new slot (in host memory whatever `platform` is: it serves hosts without IPC)."""
        if not SHM_DIR.is_dir():
            raise WeightSyncError(
                f"no {SHM_DIR} on this host: the shared-memory weight sync needs POSIX shared memory "
                "(set weight_sync.path=collective, or bridge across nodes)"
            )
        path = SHM_DIR / f"roll-device-weights-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        with open(path, "wb") as f:
            f.truncate(capacity)
        slot = cls(path, capacity)
        _touch(slot.tensor, write=True)
        return slot

    @classmethod
    def attach(cls, descriptor: tuple[str, int], platform: Platform) -> ShmSlot:
        """The sender's slot `descriptor`, mapped into this process (host memory, as `create`)."""
        path, capacity = descriptor
        if not Path(path).exists():
            raise WeightSyncError(
                f"shared-memory file {path} is not on this host: the shared-memory path needs every "
                "rollout worker on the trainer's node (check the placement, or use "
                "weight_sync.path=bridge across nodes)"
            )
        slot = cls(Path(path), capacity)
        _touch(slot.tensor, write=False)
        return slot

    def descriptor(self) -> tuple[str, int]:
        return (str(self.path), self.tensor.numel())

    def unlink(self) -> None:
        """Remove the file's name; every mapping stays valid."""
        self.path.unlink(missing_ok=True)


class IpcSlot:
    """A bucket buffer of `capacity` bytes in device memory, opened by receivers by handle."""

    def __init__(self, tensor: torch.Tensor, platform: Platform) -> None:
        self.tensor, self.platform = tensor, platform

    @classmethod
    def create(cls, capacity: int, platform: Platform) -> IpcSlot:
        """A new slot, allocated as the platform's IPC handles need (`Platform.ipc_allocation`:
        on CUDA, outside expandable segments)."""
        with platform.ipc_allocation():
            tensor = torch.empty(capacity, dtype=torch.uint8, device=platform.device())
        return cls(tensor, platform)

    @classmethod
    def attach(cls, descriptor: tuple, platform: Platform) -> IpcSlot:
        return cls(platform.open_ipc_handle(descriptor), platform)

    def descriptor(self) -> tuple:
        return self.platform.ipc_handle(self.tensor)

    def unlink(self) -> None:
        """Nothing to remove: the handle stays valid while the sender holds the buffer."""


class HostPool:
    """Host buffers; `acquire(nbytes)` returns one of that size that no tensor holds, or a new one.

    Reused buffers cost no page faults, which on the host make a fresh buffer several times slower
    to fill than one used before."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self._buffers: list[tuple[torch.Tensor, int]] = []  # (buffer, its users when idle)

    def __len__(self) -> int:
        return len(self._buffers)

    def acquire(self, nbytes: int) -> torch.Tensor:
        for buffer, idle in self._buffers:
            if buffer.numel() == nbytes and storage_users(buffer) == idle:
                return buffer
        buffer = host_buffer(nbytes, self.platform)
        self._buffers.append((buffer, storage_users(buffer)))
        return buffer
