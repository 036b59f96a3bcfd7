"""The one-copy shared-memory path: a sender's tensors that live in shared memory reach the engine
as they are, and the engine's load is the only copy of their bytes.

- `keep_in_shared_memory(tensors)`: moves each host tensor's storage into shared memory in place
  (`UntypedStorage.share_memory_`: the storage keeps its identity and only its memory moves, so
  every view of it, FSDP2's sharded parameters and the optimizer's references stay valid). One
  copy per storage, once; the trainer then trains in shared memory.
- `segment_of(tensor)`: where a host tensor lives when its storage is shared memory held by a file
  descriptor (as `keep_in_shared_memory` leaves it): the `Segment` (this process's id, the
  descriptor, the file's inode, its size) and the tensor's byte offset in it; None otherwise.
- `SegmentMaps`: a receiver's read-only mappings of the sender's segments (opened through
  `/proc/<pid>/fd/<fd>`, checked by inode, pages faulted in once), kept until a sync that reads
  in place does not use them.
  `lent()` counts the tensors of them the consumer still holds; the receiver refuses a sync whose
  consumer kept any after its load (the trainer writes that memory in its next step).

A segment has no name in /dev/shm (torch unlinks it at once): nothing is left behind if a process
dies, and it lives while the sender's storage does.
"""

from __future__ import annotations

import mmap
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from roll_device.comm.buffers import PAGE, storage_users
from roll_device.errors import WeightSyncError
from roll_device.platforms import HOST_KIND, get_platform


@dataclass(frozen=True)
class Segment:
    """A shared-memory file of `nbytes` that process `pid` holds open as descriptor `fd`."""

    pid: int
    fd: int
    inode: int
    nbytes: int

    @property
    def key(self) -> tuple[int, int]:
        """Unique while the file lives (a descriptor number is reused; an inode is not, meanwhile)."""
        return (self.pid, self.inode)


def _on_host(tensor: torch.Tensor) -> bool:
    return tensor.device.type == get_platform(HOST_KIND).device_type


def keep_in_shared_memory(tensors: Iterable[torch.Tensor]) -> int:
    """Move the storages of `tensors` (host ones; others are left alone) into shared memory in
    place; returns the bytes moved (storages already there cost nothing)."""
    moved = 0
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if _on_host(tensor) and not storage.is_shared() and storage.nbytes():
            storage.share_memory_()
            moved += storage.nbytes()
    return moved


def segment_of(tensor: torch.Tensor) -> tuple[Segment, int] | None:
    """The segment `tensor`'s bytes lie in and their offset, if they can be read in place (a
    contiguous host tensor in descriptor-held shared memory)."""
    storage = tensor.untyped_storage()
    if not (_on_host(tensor) and tensor.is_contiguous() and storage.is_shared() and tensor.numel()):
        return None
    try:
        fd, nbytes = storage._share_fd_cpu_()
    except RuntimeError:  # shared by file name (another sharing strategy): not ours to read in place
        return None
    offset = tensor.data_ptr() - storage.data_ptr()
    return Segment(os.getpid(), fd, os.fstat(fd).st_ino, nbytes), offset


def _map(segment: Segment) -> torch.Tensor:
    """The sender's segment, mapped read-only into this process (an engine cannot write the
    trainer's weights), every page faulted in now instead of during a load."""
    path = f"/proc/{segment.pid}/fd/{segment.fd}"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise WeightSyncError(
            f"cannot open the trainer's shared-memory segment {path} ({exc.strerror}): the one-copy path "
            "needs the engine on the trainer's host, as the same user"
        ) from exc
    try:
        if os.fstat(fd).st_ino != segment.inode:
            raise WeightSyncError(
                f"the trainer's shared-memory segment {path} was closed before this engine mapped it: "
                "a tensor sent in place must live until the sync is collected"
            )
        region = mmap.mmap(fd, segment.nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    with warnings.catch_warnings():  # read-only on purpose: torch warns that it cannot write it
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.frombuffer(region, dtype=torch.uint8)
    tensor[::PAGE].sum()
    return tensor


class SegmentMaps:
    """A receiver's mappings of the sender's segments, by `Segment.key`."""

    def __init__(self) -> None:
        self._maps: dict[tuple[int, int], tuple[torch.Tensor, int]] = {}  # key -> (bytes, idle users)
        self._used: set[tuple[int, int]] = set()

    def __len__(self) -> int:
        return len(self._maps)

    def add(self, segment: Segment) -> None:
        if segment.key not in self._maps:
            tensor = _map(segment)
            self._maps[segment.key] = (tensor, storage_users(tensor))

    def view(self, key: tuple[int, int], offset: int, nbytes: int) -> torch.Tensor:
        """`nbytes` bytes at `offset` of a mapped segment (a view, no copy)."""
        if key not in self._maps:
            raise WeightSyncError(
                f"a bucket refers to shared-memory segment {key} that was never announced to this "
                "receiver: the sender and this receiver disagree on what was sent before (reconnect)"
            )
        self._used.add(key)
        return self._maps[key][0][offset : offset + nbytes]

    def lent(self) -> int:
        """How many tensors of the segments the consumer still holds."""
        return sum(storage_users(tensor) - idle for tensor, idle in self._maps.values())

    def end_sync(self) -> None:
        """After a sync that read in place: unmap the segments it did not use (the trainer may have
        freed them: a mapping would keep their memory). A sync that packed everything keeps them."""
        if self._used:
            self._maps = {key: value for key, value in self._maps.items() if key in self._used}
        self._used = set()

    def close(self) -> None:
        self._maps = {}
