"""`HostTurn`: the host side of a role's colocated turns (a trainer's offload and reload, the HF
engine's sleep and wake), at memory speed.

A turn releases the device storages behind a role's tensors and later regrows them. The tensors
themselves stay (a storage shrunk to zero bytes keeps its identity, so parameters, views into
Megatron's flat buffers, FSDP2's sharded parameters and the optimizer's references all stay
valid); only the bytes move:

- into one flat host buffer per role, allocated on the first turn and reused (it grows once
  if the role's state grows, as when the optimizer's state appears after the first step), from the
  platform's memory group: page-locked where the kind `supports_pinned_memory`;
- by bulk copies: each storage's bytes as one uint8 tensor, all of them in one `_foreach_copy_`
  each way;
- non-blocking where the buffer is pinned, ordered by an event: the offload waits for its copies
  before the device memory is given back; the reload does not wait (the role's next kernels run on
  the same stream after its copies), and the next offload waits for them before it writes the
  buffer again.

`keep=False` (an engine's sleep level 2) drops the bytes instead: the storages are regrown empty
at the reload and the caller refills them (the next weight sync).

On a host kind (the CPU) the device is the host: copying the bytes into a host buffer would give
no memory back (the buffer is host memory as well) and cost two memcpys and the page faults of
regrown storages each turn, so a kept turn moves nothing there (the storages stay as they are; the
role still counts as released until `restore`); a dropped one (`keep=False`) frees the storages, as
on a device, and gives their memory back to the OS. `HostTurn(platform, copies=True)` copies on
any kind (the benchmark measures the copy path on CPU ranks that way).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from roll_device.platforms import Platform

ALIGN = 512  # bytes: each storage starts on a boundary fit for the copy engines


def distinct_storages(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """One tensor per storage behind `tensors` with bytes in them that can be resized, in
    first-seen order (the tensor keeps the storage alive; a storage object alone may outlive it
    invalid). A storage that cannot be resized is host memory mapped from a file (a checkpoint
    loaded in place, which only a host kind's tensors are): it stays where it is."""
    seen, out = set(), []
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.nbytes() and storage.resizable() and storage._cdata not in seen:
            seen.add(storage._cdata)
            out.append(tensor)
    return out


def byte_view(owner: torch.Tensor, nbytes: int) -> torch.Tensor:
    """All `nbytes` of `owner`'s storage as one uint8 tensor on its device."""
    storage = owner.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (nbytes,))


class HostTurn:
    """One role's turns: `release` before another role takes the device, `restore` after."""

    def __init__(self, platform: Platform, copies: bool | None = None) -> None:
        self.platform = platform
        self.copies = not platform.is_host if copies is None else copies  # whether kept bytes move
        self.asynchronous = platform.supports_pinned_memory
        self.buffer: torch.Tensor | None = None
        self.allocations = 0  # host buffers allocated so far: one in the steady state
        self.released_bytes = 0  # what the last release took off the device
        self._released: list[tuple[torch.Tensor, int, int]] | None = None
        self._kept = False
        self._copies = None  # the event after the last copies, where they run asynchronously

    @property
    def holding(self) -> bool:
        """Whether the role's storages are released (between `release` and `restore`)."""
        return self._released is not None

    def release(self, tensors: Iterable[torch.Tensor], keep: bool = True) -> int:
        """Copy the bytes of the storages behind `tensors` into the host buffer (`keep`) and shrink
        each storage to zero bytes; returns the bytes released (none of a kept turn on a host
        kind). Nothing to do while holding."""
        if self.holding:
            return 0
        owners = distinct_storages(tensors) if self.copies or not keep else []
        layout, total = self._layout(owners)
        if keep and layout:
            host = self._host_views(layout, total)
            self._copy(host, [byte_view(t, n) for t, _, n in layout])
            self._wait()
        for owner in owners:
            owner.untyped_storage().resize_(0)
        self._released, self._kept = layout, keep
        self.released_bytes = sum(n for _, _, n in layout)
        return self.released_bytes

    def restore(self) -> None:
        """Regrow every released storage and, where `release` kept them, copy its bytes back."""
        if not self.holding:
            return
        for owner, _, nbytes in self._released:
            owner.untyped_storage().resize_(nbytes)
        if self._kept:
            host = [self.buffer[offset : offset + n] for _, offset, n in self._released]
            self._copy([byte_view(t, n) for t, _, n in self._released], host)
        self._released = None

    @staticmethod
    def _layout(owners: list[torch.Tensor]) -> tuple[list[tuple[torch.Tensor, int, int]], int]:
        """Each storage (by a tensor on it) with its offset in the host buffer (aligned) and its
        size; the bytes in all."""
        layout, offset = [], 0
        for owner in owners:
            nbytes = owner.untyped_storage().nbytes()
            layout.append((owner, offset, nbytes))
            offset += -(-nbytes // ALIGN) * ALIGN
        return layout, offset

    def _host_views(self, layout, total: int) -> list[torch.Tensor]:
        """Views of the host buffer for `layout`, the buffer grown first where it is too small
        (after the previous copies out of it have finished)."""
        self._wait()
        if self.buffer is None or self.buffer.numel() < total:
            self.buffer = None  # the old one goes before the new one is taken
            self.buffer = self.platform.memory.host_buffer(total)
            self.allocations += 1
        return [self.buffer[offset : offset + n] for _, offset, n in layout]

    def _copy(self, destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
        if not destinations:
            return
        torch._foreach_copy_(destinations, sources, non_blocking=self.asynchronous)
        if self.asynchronous:
            self._copies = self.platform.new_event()
            self._copies.record()

    def _wait(self) -> None:
        """Until the last asynchronous copies have finished (nothing to wait for otherwise)."""
        if self._copies is not None:
            self._copies.synchronize()
            self._copies = None
