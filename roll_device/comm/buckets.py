"""Buckets: named tensors packed as bytes into fixed-size buffers, and unpacked on the other side.

A `BucketWriter` fills one buffer at a time from a stream of (name, tensor), on any device, and
describes what it wrote as `Piece`s. A tensor that does not fit in an empty bucket is split into
pieces across consecutive buckets; every other tensor stays whole. A `BucketReader` turns pieces
and a received buffer back into (name, tensor): whole tensors are views of the buffer (no copy),
split tensors are assembled into a tensor of their own. `checksum` is a CRC32 of a buffer's bytes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from roll_device.errors import WeightSyncError

ALIGN = 64  # every piece starts on a 64-byte boundary, so any dtype can view it


@dataclass(frozen=True)
class Piece:
    """Bytes [start, start + nbytes) of tensor `name` (`total` bytes), at `offset` in a bucket."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    start: int
    nbytes: int
    total: int

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.nbytes == self.total


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of `tensor` as a flat uint8 tensor on its own device (a view when contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


class BucketWriter:
    """Packs a stream of named tensors into buffers of `capacity` bytes, one `fill` per bucket."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], capacity: int) -> None:
        self.capacity = capacity
        self.tensors = 0
        self._items = iter(named_tensors)
        self._seen: set[str] = set()
        self._current: tuple[str, torch.Tensor, torch.dtype, tuple[int, ...]] | None = None
        self._position = 0
        self._advance()

    @property
    def exhausted(self) -> bool:
        return self._current is None

    def _advance(self) -> None:
        self._position = 0
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

    def fill(self, buffer: torch.Tensor) -> list[Piece]:
        """Pack the next tensors (or pieces) into `buffer` (uint8, at least `capacity` bytes)."""
        pieces: list[Piece] = []
        offset = 0
        while self._current is not None:
            name, data, dtype, shape = self._current
            offset = _align(offset)
            room = self.capacity - offset
            remaining = data.numel() - self._position
            if room <= 0 or (pieces and room < remaining <= self.capacity):
                break  # fits whole in the next bucket: keep it whole
            n = min(room, remaining)
            buffer[offset : offset + n].copy_(data[self._position : self._position + n])
            pieces.append(Piece(name, dtype, shape, offset, self._position, n, data.numel()))
            offset += n
            self._position += n
            if self._position == data.numel():
                self._advance()
        return pieces


def bucket_size(pieces: list[Piece]) -> int:
    """Bytes a bucket holding `pieces` occupies (its last byte + 1)."""
    return max((p.offset + p.nbytes for p in pieces), default=0)


def _typed(data: torch.Tensor, piece: Piece) -> torch.Tensor:
    return data.view(piece.dtype).view(piece.shape)


def _new_bytes(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


class BucketReader:
    """Unpacks received buckets into (name, tensor) on the buffer's device.

    `allocate(nbytes, device)` makes the uint8 memory a split tensor is assembled in (default: a
    new tensor; a receiver passes a pool that reuses host memory nothing holds any more)."""

    def __init__(self, allocate: Callable[[int, torch.device], torch.Tensor] = _new_bytes) -> None:
        self._allocate = allocate
        self._partial: tuple[Piece, torch.Tensor] | None = None

    def tensors(self, pieces: list[Piece], buffer: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """Whole tensors are views of `buffer`; a split tensor is yielded once its last piece arrives."""
        for piece in pieces:
            data = buffer[piece.offset : piece.offset + piece.nbytes]
            if piece.whole:
                yield piece.name, _typed(data, piece)
                continue
            if piece.start == 0:
                self._partial = (piece, self._allocate(piece.total, buffer.device))
            elif self._partial is None or self._partial[0].name != piece.name:
                raise WeightSyncError(
                    f"piece of '{piece.name}' at byte {piece.start} arrived without its start"
                )
            assembled = self._partial[1]
            assembled[piece.start : piece.start + piece.nbytes].copy_(data)
            if piece.start + piece.nbytes == piece.total:
                self._partial = None
                yield piece.name, _typed(assembled, piece)

    def finish(self) -> None:
        """Fail if a split tensor is still missing pieces when the stream ends."""
        if self._partial is not None:
            raise WeightSyncError(f"the stream ended inside weight '{self._partial[0].name}'")


def checksum(buffer: torch.Tensor) -> int:
    """CRC32 of the bytes of a uint8 buffer on any device (device buffers are read on the host)."""
    return zlib.crc32(buffer.detach().cpu().numpy())
