"""Buckets: named tensors packed as bytes into buffers, and unpacked on the other side.

A `BucketWriter` fills one bucket at a time from a stream of (name, tensor) on any device and
describes what it wrote as `Entry`s (name, dtype, shape, offset, size). Tensors are never split: a
bucket holds the tensors that fit in `capacity` bytes, and a tensor larger than that travels
alone in a bucket of its own size (`take_alone` hands its bytes over without a copy, for
transports that can send them from where they are). `unpack` turns entries and a received buffer
back into (name, tensor) views of the buffer. `checksum` is a CRC32 of a buffer's bytes.
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
    """Packs a stream of named tensors into buckets of `capacity` bytes (larger tensors alone)."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], capacity: int) -> None:
        self.capacity = capacity
        self.tensors = 0
        self._items = iter(named_tensors)
        self._seen: set[str] = set()
        self._current: tuple[str, torch.Tensor, torch.dtype, tuple[int, ...]] | None = None
        self._advance()

    @property
    def exhausted(self) -> bool:
        return self._current is None

    @property
    def next_nbytes(self) -> int:
        """Bytes of the next tensor to pack (0 when exhausted)."""
        return 0 if self._current is None else self._current[1].numel()

    @property
    def next_alone(self) -> bool:
        """Whether the next tensor is larger than a bucket, so it travels alone."""
        return self.next_nbytes > self.capacity

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
        self._current = (name, tensor_bytes(tensor), tensor.dtype, tuple(tensor.shape))

    def fill(self, buffer: torch.Tensor) -> list[Entry]:
        """Pack the next tensors that fit in `capacity` bytes into `buffer` (uint8, at least
        `capacity` bytes, or `next_nbytes` when `next_alone`)."""
        entries: list[Entry] = []
        offset = 0
        while self._current is not None:
            name, data, dtype, shape = self._current
            start = _align(offset)
            if entries and start + data.numel() > self.capacity:
                break
            buffer[start : start + data.numel()].copy_(data)
            entries.append(Entry(name, dtype, shape, start, data.numel()))
            offset = start + data.numel()
            self._advance()
        return entries

    def take_alone(self) -> tuple[list[Entry], torch.Tensor]:
        """The next tensor's entry and its bytes as they are (a view, no copy), for a tensor that
        travels alone."""
        name, data, dtype, shape = self._current
        self._advance()
        return [Entry(name, dtype, shape, 0, data.numel())], data


def bucket_size(entries: list[Entry]) -> int:
    """Bytes a bucket holding `entries` occupies (its last byte + 1)."""
    return max((e.offset + e.nbytes for e in entries), default=0)


def unpack(entries: list[Entry], buffer: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for each entry: views of `buffer`, no copy."""
    for e in entries:
        yield e.name, buffer[e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape)


def checksum(buffer: torch.Tensor) -> int:
    """CRC32 of the bytes of a uint8 buffer on any device (device buffers are read on the host)."""
    return zlib.crc32(buffer.detach().cpu().numpy())
