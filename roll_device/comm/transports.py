"""How a bucket's bytes move once packed: through shared slots, or by a group broadcast.

- Slot transports (`shm`, `ipc`): the sender packs into a slot every receiver has mapped and
  publishes the header; receivers read the slot in place. The sender runs at most `AHEAD` buckets
  ahead of the slowest receiver (it waits for bucket i-4 to be read before it packs bucket i), and
  reuses a slot once every receiver has released it, i.e. once no tensor it handed out still uses
  that slot's memory (each acknowledgement carries the receiver's releases). While a consumer
  keeps tensors, the sender makes another slot (announced in the header that uses it), so that a
  consumer that gathers tensors before it loads them never sees them overwritten.
- Broadcast transport: the header goes through the control store, the bytes by an asynchronous
  broadcast from rank 0 in a group of their own (the kind's backend for `collective`, gloo for the
  host bridge), in messages of at most 16 MiB. Tensors of 1 MiB or more already on the group's
  device are broadcast from their own memory; each run of the others is packed into a buffer of a
  ring and broadcast as one range; at most `AHEAD` buckets are in flight. Each receiver posts the
  next buckets (up to `AHEAD`) before it hands bucket i over, into host buffers nothing holds
  (host receive buffers) or into a ring of device buffers (which receivers copy out of before
  use); either way the bucket's layout is the same.

Slots and buffers hold `capacity` bytes; a tensor larger than that gets a slot or buffer of its
own size (slots are kept and reused, like the others).

Sender side: `connect`, then per bucket: for each tensor `sends_in_place(part)` (its bytes go as
they are), the rest packed into `buffer(seq, index, nbytes)`, then `send(seq, header, data)` (or
`cancel()` if the bucket will not be sent), then `finish(seq, released)` once every receiver is
done.
Receiver side: `connect`, then `buckets(seq)` yields (header, bytes) (None for a sender's error
header); `released()` is what a receiver reports with its status at the end of a sync (slot
releases), and the sender's `finish(seq, released)` takes it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from roll_device.comm.buffers import HostPool, IpcSlot, ShmSlot, host_buffer, storage_users
from roll_device.comm.control import Control, ack_key, bucket_key
from roll_device.comm.groups import MESSAGE_BYTES, broadcast_bytes, close_group, new_group
from roll_device.comm.messages import BucketHeader
from roll_device.comm.planner import HOST, SyncPlan
from roll_device.errors import WeightSyncError
from roll_device.platforms import Platform, get_platform

SLOTS = 2  # slots a slot sender makes when it connects (more as needed)
AHEAD = 4  # buckets a sender may have in flight ahead of the slowest receiver (uneven ones overlap)
IN_PLACE_BYTES = 1 << 20  # tensors this large on the group's device are broadcast without packing
SETUP_KEY = "setup"
SLOTS_KEY = "setup/slots"


@dataclass(frozen=True)
class Setup:
    """What the sender publishes for receivers when it opens: the plan, how many receivers there
    are, the bucket capacity and the largest broadcast message."""

    plan: SyncPlan
    receivers: int
    capacity: int
    message_bytes: int = MESSAGE_BYTES


def _attached_key(rank: int) -> str:
    return f"setup/attached/{rank}"


def _ranks(setup: Setup) -> range:
    return range(1, setup.receivers + 1)


def _slot_class(setup: Setup) -> type[ShmSlot | IpcSlot]:
    return IpcSlot if setup.plan.transport == "ipc" else ShmSlot


class SlotSender:
    def __init__(self, control: Control, setup: Setup, platform: Platform) -> None:
        self.control, self.setup, self.platform = control, setup, platform
        self.slots: list[ShmSlot | IpcSlot] = []
        self.handed: list[int] = []  # times each slot was handed out
        self.released: dict[int, list[int]] = {r: [] for r in _ranks(setup)}  # as each receiver last said
        self._to_unlink: list[tuple[int, int]] = []  # (slot, the bucket that announced it)
        self._next: tuple[int, tuple | None] | None = None

    def _new_slot(self, nbytes: int) -> int:
        self.slots.append(_slot_class(self.setup).create(nbytes, self.platform))
        self.handed.append(0)
        return len(self.slots) - 1

    def connect(self) -> None:
        for _ in range(SLOTS):
            self._new_slot(self.setup.capacity)
        self.control.put(SLOTS_KEY, [slot.descriptor() for slot in self.slots])
        try:
            self.control.wait(
                [_attached_key(r) for r in _ranks(self.setup)], "every rollout worker to map the slots"
            )
        finally:  # mapped by everyone, or given up on: the names go either way
            for slot in self.slots:
                slot.unlink()

    def sends_in_place(self, part: torch.Tensor) -> bool:
        """Bytes travel only through slots."""
        return False

    def buffer(self, seq: int, index: int, nbytes: int) -> torch.Tensor:
        """A slot of at least `nbytes` that every receiver has released (a new one of that size if
        none)."""
        if index >= AHEAD:
            read = index - AHEAD
            ranks = list(_ranks(self.setup))
            acks = self.control.get_many(
                [ack_key(seq, read, r) for r in ranks], f"every rollout worker to read bucket {read}"
            )
            self.learn(dict(zip(ranks, acks)))
            self._unlink_announced(up_to=read)
        number = self._free_slot(nbytes)
        descriptor = None
        if number is None:
            number = self._new_slot(nbytes)
            descriptor = self.slots[number].descriptor()
            self._to_unlink.append((number, index))
        self.handed[number] += 1
        self._next = (number, descriptor)
        return self.slots[number].tensor

    def learn(self, released: dict[int, list[int] | None]) -> None:
        """Take each receiver's count of releases per slot (from an acknowledgement or its status)."""
        for rank, counts in released.items():
            if counts is not None:
                self.released[rank] = counts

    def _free_slot(self, nbytes: int) -> int | None:
        """The smallest slot of at least `nbytes` that every receiver has released."""

        def released(rank: int, number: int) -> int:
            counts = self.released[rank]
            return counts[number] if number < len(counts) else 0

        free = [
            number
            for number, slot in enumerate(self.slots)
            if slot.tensor.numel() >= nbytes
            and all(released(r, number) == self.handed[number] for r in self.released)
        ]
        return min(free, key=lambda number: self.slots[number].tensor.numel(), default=None)

    def _unlink_announced(self, up_to: int) -> None:
        """Unlink new slots whose announcing bucket every receiver has read (so has mapped)."""
        for number, bucket in [entry for entry in self._to_unlink if entry[1] <= up_to]:
            self.slots[number].unlink()
            self._to_unlink.remove((number, bucket))

    def send(self, seq: int, header: BucketHeader, data: list[torch.Tensor]) -> None:
        (header.slot, header.new_slot), self._next = self._next, None
        if self.setup.plan.staging == "device":
            self.platform.synchronize()  # the packing copies must land before a receiver reads
        self.control.post(bucket_key(seq, header.index), header)

    def cancel(self) -> None:
        """The slot handed out last will not be sent: take it back."""
        if self._next is not None:
            self.handed[self._next[0]] -= 1
            self._next = None

    def finish(self, seq: int, released: dict[int, list[int] | None]) -> None:
        """Every receiver is done (so has mapped every slot) and said what it released."""
        self.learn(released)
        for slot in self.slots:
            slot.unlink()
        self._to_unlink = []

    def used_keys(self, seq: int, buckets: int) -> list[str]:
        return [ack_key(seq, i, r) for i in range(buckets) for r in _ranks(self.setup)]

    def close(self) -> None:
        for slot in self.slots:
            slot.unlink()
        self.slots = []


class SlotReceiver:
    def __init__(self, control: Control, setup: Setup, platform: Platform, rank: int) -> None:
        self.control, self.setup, self.platform, self.rank = control, setup, platform, rank
        self.slots: list[ShmSlot | IpcSlot] = []
        self._idle: list[int] = []  # users of each slot's memory when no tensor of ours holds it
        self._released: list[int] = []
        self._held: set[int] = set()

    def _attach(self, descriptor) -> None:
        slot = _slot_class(self.setup).attach(descriptor, self.platform)
        self.slots.append(slot)
        self._idle.append(storage_users(slot.tensor))
        self._released.append(0)

    def connect(self) -> None:
        for descriptor in self.control.get(SLOTS_KEY, "the sender's slots"):
            self._attach(descriptor)
        self.control.put(_attached_key(self.rank), True)

    def buckets(self, seq: int) -> Iterator[tuple[BucketHeader, torch.Tensor | None]]:
        index = 0
        while True:
            header = self.control.get(bucket_key(seq, index), f"bucket {index} of sync {seq}")
            if header.error is not None:
                yield header, None
                return
            if header.new_slot is not None:
                if header.slot != len(self.slots):
                    raise WeightSyncError(
                        f"slot {header.slot} announced out of order (have {len(self.slots)})"
                    )
                self._attach(header.new_slot)
            self._held.add(header.slot)
            yield header, self.slots[header.slot].tensor[: header.nbytes]
            if self.setup.plan.staging == "device":
                self.platform.synchronize()  # copies out of the slot are done before it is released
            self.control.post(ack_key(seq, index, self.rank), self.released())
            if header.final:
                return
            index += 1

    def released(self) -> list[int]:
        """How often each slot was released: slots no tensor of this process uses any more are
        released now."""
        for number in sorted(self._held):
            if storage_users(self.slots[number].tensor) == self._idle[number]:
                self._held.discard(number)
                self._released[number] += 1
        return list(self._released)

    def close(self) -> None:
        self.slots = []


def _host_staged(setup: Setup, platform: Platform) -> bool:
    """Whether this side's bucket buffers live in host memory."""
    return setup.plan.staging == "host" or platform.device_type == get_platform(HOST).device_type


def _group_device(setup: Setup, platform: Platform) -> torch.device:
    return platform.device() if setup.plan.staging == "device" else get_platform(HOST).device()


class BroadcastSender:
    def __init__(self, control: Control, setup: Setup, platform: Platform) -> None:
        self.control, self.setup, self.platform = control, setup, platform
        self.group = None
        self._in_flight: list[tuple | None] = [None] * AHEAD  # (works, the bytes they send)
        self._buffers: list[torch.Tensor | None] = [None] * AHEAD  # packing buffers, made when needed

    def connect(self) -> None:
        self.device = _group_device(self.setup, self.platform)
        self.group = new_group(
            self.control, self.setup.plan.backend, 0, self.setup.receivers + 1, self.device
        )

    def _staging(self, nbytes: int) -> torch.Tensor:
        if self.setup.plan.staging == "host":
            return host_buffer(nbytes, self.platform)
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def sends_in_place(self, part: torch.Tensor) -> bool:
        """A tensor of at least `IN_PLACE_BYTES` already on the group's device is broadcast from
        its own memory (smaller ones are cheaper to pack than to send one by one)."""
        return part.device == self.device and part.numel() >= IN_PLACE_BYTES

    def buffer(self, seq: int, index: int, nbytes: int) -> torch.Tensor:
        """A packing buffer for bucket `index`: the ring's, once the bucket that used it is sent."""
        ring = index % AHEAD
        self._wait(ring)
        if nbytes > self.setup.capacity:
            return self._staging(nbytes)
        if self._buffers[ring] is None:
            self._buffers[ring] = self._staging(self.setup.capacity)
        return self._buffers[ring]

    def _wait(self, ring: int) -> None:
        sending, self._in_flight[ring] = self._in_flight[ring], None
        if sending is not None:
            for work in sending[0]:
                work.wait()

    def send(self, seq: int, header: BucketHeader, data: list[torch.Tensor]) -> None:
        self._wait(header.index % AHEAD)  # at most AHEAD buckets in flight
        self.control.post(bucket_key(seq, header.index), header)
        works = [
            work for part in data for work in broadcast_bytes(self.group, part, self.setup.message_bytes)
        ]
        self._in_flight[header.index % AHEAD] = (works, data)

    def cancel(self) -> None:
        """Nothing was handed out that needs taking back."""

    def finish(self, seq: int, released: dict[int, list[int] | None]) -> None:
        for ring in range(AHEAD):
            self._wait(ring)

    def used_keys(self, seq: int, buckets: int) -> list[str]:
        return []

    def close(self) -> None:
        if self.group is not None:
            close_group(self.group, self.device)
            self.group = None


class BroadcastReceiver:
    def __init__(self, control: Control, setup: Setup, platform: Platform, rank: int) -> None:
        self.control, self.setup, self.platform, self.rank = control, setup, platform, rank
        self.group = None

    def connect(self) -> None:
        self.device = _group_device(self.setup, self.platform)
        if _host_staged(self.setup, self.platform):
            self.pool, self.buffers = HostPool(self.platform), None
        else:  # a device bucket is copied out before the next is asked for: a ring is enough
            self.pool = None
            self.buffers = [
                torch.empty(self.setup.capacity, dtype=torch.uint8, device=self.device)
                for _ in range(AHEAD + 1)
            ]
        self.group = new_group(
            self.control, self.setup.plan.backend, self.rank, self.setup.receivers + 1, self.device
        )

    def _post(self, header: BucketHeader) -> tuple[BucketHeader, torch.Tensor | None, list]:
        """Bucket `header`, the buffer it lands in and the broadcasts that fill its ranges."""
        if header.error is not None:
            return header, None, []
        size = max(header.nbytes, self.setup.capacity)
        if self.pool is not None:
            buffer = self.pool.acquire(size)
        elif header.nbytes > self.setup.capacity:
            buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        else:
            buffer = self.buffers[header.index % len(self.buffers)]
        works = [
            work
            for start, end in header.ranges
            for work in broadcast_bytes(self.group, buffer[start:end], self.setup.message_bytes)
        ]
        return header, buffer[: header.nbytes], works

    def buckets(self, seq: int) -> Iterator[tuple[BucketHeader, torch.Tensor | None]]:
        """Buckets in order. Before handing bucket i over, bucket i+1 is posted (waiting for its
        header) and so are the next ones whose headers are already there, up to AHEAD, so that
        the transfer never stalls at a bucket boundary."""
        posted: deque = deque()
        index = 0
        while True:
            while self._post_more(seq, index, posted):
                header = self.control.get(bucket_key(seq, index), f"bucket {index} of sync {seq}")
                posted.append(self._post(header))
                index += 1
            header, data, works = posted.popleft()
            for work in works:
                work.wait()
            yield header, data
            if header.ends:
                return

    def _post_more(self, seq: int, index: int, posted: deque) -> bool:
        """Whether to post bucket `index` now: always the one after the bucket about to be handed
        over; further ones while their headers are already there, up to AHEAD."""
        if posted and posted[-1][0].ends:
            return False
        if len(posted) < 2:
            return True
        return len(posted) <= AHEAD and self.control.exists(bucket_key(seq, index))

    def released(self) -> None:
        """Receive buffers are this receiver's own: nothing to report to the sender."""

    def close(self) -> None:
        if self.group is not None:
            close_group(self.group, self.device)
            self.group = None


def sender_transport(control: Control, setup: Setup, platform: Platform) -> SlotSender | BroadcastSender:
    cls = BroadcastSender if setup.plan.transport == "broadcast" else SlotSender
    return cls(control, setup, platform)


def receiver_transport(
    control: Control, setup: Setup, platform: Platform, rank: int
) -> SlotReceiver | BroadcastReceiver:
    cls = BroadcastReceiver if setup.plan.transport == "broadcast" else SlotReceiver
    return cls(control, setup, platform, rank)
