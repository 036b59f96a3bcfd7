"""Buckets: named tensors packed as bytes into buffers, and unpacked on the other side.

A `BucketWriter` takes one bucket at a time from a stream of (name, tensor) on any device: the
`Entry`s (name, dtype, shape, offset, size) and the tensors as they are (no copy). Tensors are
never split: a bucket holds the tensors that fit in `capacity` bytes, each at a 64-byte boundary,
and a tensor larger than that travels alone in a bucket of its own size. Such tensors at the head
of the stream (an embedding) wait until the first regular bucket has been taken: the first bucket
is packed while the receivers have nothing to load, so it should be a small one. `pack` copies a bucket
into a buffer in one batched copy (`torch._foreach_copy_` into typed views of the buffer: one
launch per bucket on a device, and a non-contiguous tensor lands without a copy of its own first);
`unpack` turns entries and a received buffer (or a `Scattered` bucket, whose ranges lie apart)
back into (name, tensor) views of it. `checksum` is
a CRC32 of the entries' bytes.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from roll_device.errors import WeightSyncError

ALIGN = 64  # every entry starts on a 64-byte boundary, so any dtype can view it


@dataclass(frozen=True)
class Entry:
    """Tensor `name` (`dtype`, `shape`) as `nbytes` bytes at `offset` in a bucket."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of `tensor` as a flat uint8 tensor on its own device (a view when contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


class BucketWriter:
    """Cuts a stream of named tensors into buckets of `capacity` bytes (larger tensors alone)."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], capacity: int) -> None:
        self.capacity = capacity
        self.tensors = 0
        self._items = iter(named_tensors)
        self._seen: set[str] = set()
        self._current: tuple[str, torch.Tensor, int] | None = None
        self._deferred: list[tuple[str, torch.Tensor, int]] = []  # large tensors that led the stream
        self._advance()
        while self._current is not None and self._current[2] > capacity:
            self._deferred.append(self._current)
            self._advance()
        self._started = False  # whether a regular bucket was taken

    @property
    def exhausted(self) -> bool:
        return self._current is None and not self._deferred

    def _advance(self) -> None:
        item = next(self._items, None)
        if item is None:
            self._current = None
            return
        name, tensor = item
        if not isinstance(tensor, torch.Tensor):
            raise WeightSyncError(f"weight '{name}' is a {type(tensor).__name__}, not a tensor")
        if name in self._seen:
            raise WeightSyncError(f"weight '{name}' appears twice in the exported weights")
        self._seen.add(name)
        self.tensors += 1
        tensor = tensor.detach()
        self._current = (name, tensor, tensor.numel() * tensor.element_size())

    def take(self) -> tuple[list[Entry], list[torch.Tensor]]:
        """The next bucket: the entries of the tensors that fit in `capacity` bytes (or of one
        larger tensor, alone) and the tensors as they are (no copy)."""
        if self._deferred and (self._started or self._current is None):
            name, tensor, nbytes = self._deferred.pop(0)
            return [Entry(name, tensor.dtype, tuple(tensor.shape), 0, nbytes)], [tensor]
        self._started = True
        entries: list[Entry] = []
        parts: list[torch.Tensor] = []
        offset = 0
        while self._current is not None:
            name, tensor, nbytes = self._current
            start = _align(offset)
            if entries and start + nbytes > self.capacity:
                break
            entries.append(Entry(name, tensor.dtype, tuple(tensor.shape), start, nbytes))
            parts.append(tensor)
            offset = start + nbytes
            self._advance()
        return entries, parts


def typed_views(entries: list[Entry], buffer: Bucket) -> list[torch.Tensor]:
    """Each entry's place in a bucket buffer as a tensor of its dtype and shape (views)."""
    return [
        data.view(entry.dtype).view(entry.shape) for entry, data in zip(entries, entry_bytes(entries, buffer))
    ]


def pack(entries: list[Entry], parts: list[torch.Tensor], buffer: torch.Tensor) -> torch.Tensor:
    """Copy `parts` to their entries' offsets in `buffer` (one batched copy); the packed bucket
    (a view of it)."""
    if entries:
        torch._foreach_copy_(typed_views(entries, buffer), parts)
    return buffer[: bucket_size(entries)]


def bucket_size(entries: list[Entry]) -> int:
    """Bytes a bucket holding `entries` occupies (its last byte + 1)."""
    return max((e.offset + e.nbytes for e in entries), default=0)


class Scattered:
    """A received bucket whose bytes lie in several places: per byte range of the bucket, its start
    and a tensor of its bytes (views of where they lie)."""

    def __init__(self, parts: list[tuple[int, torch.Tensor]]) -> None:
        self.parts = parts

    def at(self, offset: int, nbytes: int) -> torch.Tensor:
        """The bucket's `nbytes` bytes at `offset` (inside one range)."""
        for start, data in self.parts:
            if start <= offset and offset + nbytes <= start + data.numel():
                return data[offset - start : offset - start + nbytes]
        raise WeightSyncError(f"bytes {offset}..{offset + nbytes} of a bucket lie in none of its ranges")

    def to(self, device: torch.device, copy: bool = True) -> Scattered:
        return Scattered([(start, data.to(device, copy=copy)) for start, data in self.parts])


Bucket = torch.Tensor | Scattered  # a received bucket's bytes: one buffer, or ranges apart


def entry_bytes(entries: list[Entry], buffer: Bucket) -> list[torch.Tensor]:
    """Each entry's bytes in a bucket buffer (views)."""
    if isinstance(buffer, Scattered):
        return [buffer.at(e.offset, e.nbytes) for e in entries]
    return [buffer[e.offset : e.offset + e.nbytes] for e in entries]


def unpack(entries: list[Entry], buffer: Bucket) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for each entry: views of `buffer`, no copy."""
    for entry, view in zip(entries, typed_views(entries, buffer)):
        yield entry.name, view


def checksum(parts: list[torch.Tensor]) -> int:
    """CRC32 over the bytes of tensors in order (any dtype, any device: device bytes are read on
    the host); padding between entries is not part of it."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(tensor_bytes(part).cpu().numpy(), crc)
    return crc
