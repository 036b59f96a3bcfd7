"""How a bucket's bytes move once packed: the two sides every transport implements
(`SenderTransport`, `ReceiverTransport`), and the setup both ends share. The implementations:
slot_transport.py (`shm`, `ipc`: shared slots), broadcast_transport.py (`broadcast`: a
process-group broadcast) and rdt_transport.py (`rdt`: Ray Direct Transport between actors); the
sender and receiver pick one from the plan's transport.

Slots and buffers hold `capacity` bytes; a tensor larger than that gets a slot or buffer of its
own size (slots are kept and reused, like the others).

Sender side: `connect`, then per bucket: for each tensor `sends_in_place(part)` (its bytes go as
they are), the rest packed into `buffer(seq, index, nbytes)`, then `send(seq, header, data)` (or
`cancel()` if the bucket will not be sent), then `finish(seq, released)` once every receiver is
done.
Receiver side: `connect`, then `buckets(seq)` yields (header, bytes) (None for a sender's error
header; the bytes are one buffer, or each entry's bytes apart where they lie in several places);
`check_returned()` once the consumer has loaded; `released()` is what a receiver reports with its status at the end of a sync (slot
releases), and the sender's `finish(seq, released)` takes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from roll_device.comm.groups import MESSAGE_BYTES
from roll_device.comm.messages import BucketHeader
from roll_device.comm.planner import SyncPlan
from roll_device.platforms import Platform

AHEAD = 4  # buckets a sender may have in flight ahead of the slowest receiver (uneven ones overlap)
SETUP_KEY = "setup"


@dataclass(frozen=True)
class Setup:
    """What the sender publishes for receivers when it opens: the plan, how many receivers there
    are, the bucket capacity, the largest broadcast message and whether buckets are verified."""

    plan: SyncPlan
    receivers: int
    capacity: int
    message_bytes: int = MESSAGE_BYTES
    verify: bool = False


def stream_done(platform: Platform) -> None:
    """Wait until the work queued so far on this process's current stream (packing or loading
    copies) has run: an event recorded and waited for, not a synchronisation of the whole device
    (which would also wait for every other stream: a trainer's or an engine's own work)."""
    event = platform.new_event()
    event.record()
    event.synchronize()


def in_place_key(rank: int) -> str:
    """Where receiver `rank` says whether its consumer copies what it is given before it returns
    (so may be given views of the sender's own memory: the one-copy path)."""
    return f"setup/in_place/{rank}"


def receiver_ranks(setup: Setup) -> range:
    """The receivers' ranks (the sender is rank 0)."""
    return range(1, setup.receivers + 1)


class SenderTransport(Protocol):
    """The sender's side of a transport, on the trainer's rank 0."""

    def connect(self) -> None:
        """Meet every receiver (they connect at the same time)."""

    def sends_in_place(self, part: torch.Tensor) -> bool:
        """Whether `part`'s bytes go as they are instead of being packed into `buffer`."""

    def buffer(self, seq: int, index: int, nbytes: int) -> torch.Tensor:
        """A buffer of at least `nbytes` to pack bucket `index` of sync `seq` into."""

    def send(self, seq: int, header: BucketHeader, data: list[torch.Tensor]) -> None:
        """Send bucket `header.index` (its packed buffer and the tensors sent in place)."""

    def cancel(self) -> None:
        """The buffer handed out last will not be sent."""

    def finish(self, seq: int, released: dict[int, list[int] | None]) -> None:
        """Every receiver is done with sync `seq` and reported what it released."""

    def used_keys(self, seq: int, buckets: int) -> list[str]:
        """Control-store keys of sync `seq` this transport wrote, for cleanup."""

    def close(self) -> None:
        """Free what `connect` made."""


class ReceiverTransport(Protocol):
    """A rollout worker's side of a transport."""

    def connect(self) -> None:
        """Meet the sender (which connects at the same time)."""

    def buckets(self, seq: int) -> Iterator[tuple[BucketHeader, torch.Tensor | None]]:
        """The buckets of sync `seq` in order, with their bytes (None after a sender's error)."""

    lends: bool
    """Whether the buckets it yields may go to the consumer as they are, on any device (it reuses
    a buffer only once no tensor holds it); otherwise a device bucket is copied out first."""

    def released(self) -> list[int] | None:
        """What this receiver reports to the sender at the end of a sync (slot releases)."""

    def check_returned(self) -> None:
        """After the consumer's load: refuse the sync if the consumer kept what it had to copy
        (views of the sender's own memory, which the sender writes next)."""

    def close(self) -> None:
        """Free what `connect` made."""
