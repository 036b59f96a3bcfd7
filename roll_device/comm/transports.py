"""How a bucket's bytes move once packed: through shared slots, or by a group broadcast.

Both kinds keep two buffers per side, so the sender packs bucket i+1 while bucket i is in flight
or being read.

- Slot transports (`shm`, `ipc`): the sender packs into slot i % 2 of a ring every receiver has
  mapped, publishes the header, and reuses the slot once every receiver acknowledged bucket i-2.
  Receivers read the slot in place.
- Broadcast transport: the header goes through the control store, the bytes by an asynchronous
  broadcast from rank 0 in a group of their own (the kind's backend for `collective`, gloo for the
  host bridge); each receiver posts bucket i+1 before it hands bucket i over.

Sender side: `connect`, then per bucket `buffer(seq, index)` -> pack -> `send(seq, header, data)`,
then `finish(seq)`. Receiver side: `connect`, then `buckets(seq)` yields (header, bytes), the bytes
valid until the next item is requested (None for a sender's error header).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from roll_device.comm.buffers import IpcRing, ShmRing, host_buffer
from roll_device.comm.control import Control, ack_key, bucket_key
from roll_device.comm.groups import broadcast, close_group, new_group
from roll_device.comm.messages import BucketHeader
from roll_device.comm.planner import HOST, SyncPlan
from roll_device.platforms import Platform, get_platform

SLOTS = 2
SETUP_KEY = "setup"
SLOTS_KEY = "setup/slots"


@dataclass(frozen=True)
class Setup:
    """What the sender publishes for receivers when it opens: the plan, how many receivers there
    are, and the bucket capacity."""

    plan: SyncPlan
    receivers: int
    capacity: int


def _attached_key(rank: int) -> str:
    return f"setup/attached/{rank}"


def _ranks(setup: Setup) -> range:
    return range(1, setup.receivers + 1)


class SlotSender:
    def __init__(self, control: Control, setup: Setup, platform: Platform) -> None:
        self.control, self.setup, self.platform = control, setup, platform
        self.ring: ShmRing | IpcRing | None = None

    def connect(self) -> None:
        if self.setup.plan.transport == "ipc":
            self.ring = IpcRing.create(self.setup.capacity, SLOTS, self.platform)
        else:
            self.ring = ShmRing.create(self.setup.capacity, SLOTS)
        self.control.put(SLOTS_KEY, self.ring.descriptor())
        self.control.wait(
            [_attached_key(r) for r in _ranks(self.setup)], "every rollout worker to map the slots"
        )
        self.ring.attached()

    def buffer(self, seq: int, index: int) -> torch.Tensor:
        if index >= SLOTS:
            done = index - SLOTS
            self.control.wait(
                [ack_key(seq, done, r) for r in _ranks(self.setup)],
                f"every rollout worker to release bucket {done}",
            )
        return self.ring.slot(index % SLOTS)

    def send(self, seq: int, header: BucketHeader, data: torch.Tensor) -> None:
        header.slot = header.index % SLOTS
        if self.setup.plan.staging == "device":
            self.platform.synchronize()  # the packing copies must land before a receiver reads
        self.control.put(bucket_key(seq, header.index), header)

    def finish(self, seq: int) -> None:
        """Receivers acknowledge every slot before they report done: nothing left in flight."""

    def used_keys(self, seq: int, buckets: int) -> list[str]:
        return [ack_key(seq, i, r) for i in range(buckets) for r in _ranks(self.setup)]

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()


class SlotReceiver:
    def __init__(self, control: Control, setup: Setup, platform: Platform, rank: int) -> None:
        self.control, self.setup, self.platform, self.rank = control, setup, platform, rank
        self.ring: ShmRing | IpcRing | None = None

    def connect(self) -> None:
        descriptor = self.control.get(SLOTS_KEY, "the sender's slots")
        if self.setup.plan.transport == "ipc":
            self.ring = IpcRing.attach(descriptor, self.platform)
        else:
            self.ring = ShmRing.attach(descriptor)
        self.control.put(_attached_key(self.rank), True)

    def buckets(self, seq: int) -> Iterator[tuple[BucketHeader, torch.Tensor | None]]:
        index = 0
        while True:
            header = self.control.get(bucket_key(seq, index), f"bucket {index} of sync {seq}")
            if header.error is not None:
                yield header, None
                return
            yield header, self.ring.slot(header.slot)[: header.nbytes]
            if self.setup.plan.staging == "device":
                self.platform.synchronize()  # reads of the slot are done before it is released
            self.control.put(ack_key(seq, index, self.rank), True)
            if header.final:
                return
            index += 1

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()


def _staging(setup: Setup, platform: Platform) -> tuple[list[torch.Tensor], torch.device]:
    """Two bucket buffers and the device the group's handshakes run on."""
    if setup.plan.staging == "device":
        device = platform.device()
        return [torch.empty(setup.capacity, dtype=torch.uint8, device=device) for _ in range(SLOTS)], device
    buffers = [host_buffer(setup.capacity, platform) for _ in range(SLOTS)]
    return buffers, get_platform(HOST).device()


class BroadcastSender:
    def __init__(self, control: Control, setup: Setup, platform: Platform) -> None:
        self.control, self.setup, self.platform = control, setup, platform
        self.group = None
        self._works: list = [None] * SLOTS

    def connect(self) -> None:
        self.buffers, self.device = _staging(self.setup, self.platform)
        self.group = new_group(self.control, self.setup.plan.backend, 0, self.setup.receivers + 1, self.device)

    def buffer(self, seq: int, index: int) -> torch.Tensor:
        self._wait(index % SLOTS)
        return self.buffers[index % SLOTS]

    def _wait(self, slot: int) -> None:
        work, self._works[slot] = self._works[slot], None
        if work is not None:
            work.wait()

    def send(self, seq: int, header: BucketHeader, data: torch.Tensor) -> None:
        self.control.put(bucket_key(seq, header.index), header)
        if header.error is None and header.nbytes:
            self._works[header.index % SLOTS] = broadcast(self.group, data)

    def finish(self, seq: int) -> None:
        for slot in range(SLOTS):
            self._wait(slot)

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
        self.buffers, self.device = _staging(self.setup, self.platform)
        self.group = new_group(
            self.control, self.setup.plan.backend, self.rank, self.setup.receivers + 1, self.device
        )

    def _post(self, header: BucketHeader):
        if header.error is not None or not header.nbytes:
            return None
        return broadcast(self.group, self.buffers[header.index % SLOTS][: header.nbytes])

    def _header(self, seq: int, index: int) -> BucketHeader:
        return self.control.get(bucket_key(seq, index), f"bucket {index} of sync {seq}")

    def buckets(self, seq: int) -> Iterator[tuple[BucketHeader, torch.Tensor | None]]:
        header = self._header(seq, 0)
        work = self._post(header)
        while True:
            if work is not None:
                work.wait()
            upcoming = upcoming_work = None
            if not header.ends:  # post the next bucket before this one is handed over
                upcoming = self._header(seq, header.index + 1)
                upcoming_work = self._post(upcoming)
            data = None if header.error is not None else self.buffers[header.index % SLOTS][: header.nbytes]
            yield header, data
            if upcoming is None:
                return
            header, work = upcoming, upcoming_work

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
