"""The slot transports (`shm`, `ipc`): buckets pass through slots every receiver has mapped.

The sender packs into a slot every receiver has mapped and
publishes the header; receivers read the slot in place. The sender runs at most `AHEAD` buckets
ahead of the slowest receiver (it waits for bucket i-4 to be read before it packs bucket i), and
reuses a slot once every receiver has released it, i.e. once no tensor it handed out still uses
that slot's memory (each acknowledgement carries the receiver's releases). Slots live as long as
the connection: `SLOTS` are made and mapped (one name or handle each) when it opens. When none is
known free, the sender reads the acknowledgements of the buckets in flight, oldest first, until
one is; only while a consumer keeps tensors of every slot does it make another slot (announced in
the header that uses it), so that a consumer that gathers tensors before it loads them never sees
them overwritten. Three slots keep both ends busy with a consumer that loads each tensor as it
comes: the receiver acknowledges bucket i while the consumer still holds its last tensor, so slot
i shows free in the acknowledgement of bucket i+1, when bucket i+2 is already there to load.

On a device (`ipc`), packing and loading copies are awaited with an event on the current stream
(`stream_done`), not by synchronising the whole device.

The one-copy path (`shm`, when every receiver said at connect that its consumer copies what it is
given: `in_place_key`): a tensor the sender holds in descriptor-held shared memory (a trainer's
parameters after `keep_in_shared_memory`, segments.py) is not packed. Its header's `places` say,
per byte range, which segment and offset it lies at (`new_segments` describes each segment the
first time a sync uses it); receivers map each segment once, read-only, keep it until a sync that
reads in place leaves it out, and hand their consumer views of it, so the engine's load is the only copy of those bytes. The sender keeps such tensors
alive until every receiver is done with the sync; a receiver whose consumer still holds a view of
a segment after its load fails the sync (`check_returned`), since the trainer writes that memory
in its next step.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from roll_device.comm.buckets import Scattered
from roll_device.comm.buffers import IpcSlot, ShmSlot, storage_users
from roll_device.comm.control import Control, ack_key, bucket_key
from roll_device.comm.messages import BucketHeader
from roll_device.comm.segments import SegmentMaps, segment_of
from roll_device.comm.transport import AHEAD, Setup, in_place_key, receiver_ranks, stream_done
from roll_device.errors import WeightSyncError
from roll_device.platforms import Platform

SLOTS = 3  # slots a slot sender makes when it connects (more only while a consumer keeps tensors)
SLOTS_KEY = "setup/slots"


def _attached_key(rank: int) -> str:
    return f"setup/attached/{rank}"


def _slot_class(setup: Setup) -> type[ShmSlot | IpcSlot]:
    return IpcSlot if setup.plan.transport == "ipc" else ShmSlot


class SlotSender:
    def __init__(self, control: Control, setup: Setup, platform: Platform) -> None:
        self.control, self.setup, self.platform = control, setup, platform
        self.slots: list[ShmSlot | IpcSlot] = []
        self.handed: list[int] = []  # times each slot was handed out
        # slot releases per receiver, as each receiver last said
        self.released: dict[int, list[int]] = {r: [] for r in receiver_ranks(setup)}
        self._to_unlink: list[tuple[int, int]] = []  # (slot, the bucket that announced it)
        self._next: tuple[int, tuple | None] | None = None
        self._acked = (-1, 0)  # (sync, buckets of it every receiver has acknowledged)
        self._announced: set[tuple[int, int]] = set()  # segments described in this sync
        self.in_place = False  # whether every receiver takes views of our memory (known at connect)
        self._lent: list[torch.Tensor] = []  # tensors sent in place in this sync, kept alive till its end

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
                [_attached_key(r) for r in receiver_ranks(self.setup)],
                "every rollout worker to map the slots",
            )
        finally:  # mapped by everyone, or given up on: the names go either way
            for slot in self.slots:
                slot.unlink()
        ranks = receiver_ranks(self.setup)
        takes = self.control.get_many([in_place_key(r) for r in ranks], "every rollout worker's consumer")
        self.in_place = self.setup.plan.transport == "shm" and all(takes)

    def sends_in_place(self, part: torch.Tensor) -> bool:
        """A host tensor in descriptor-held shared memory goes as it is (shm, every receiver's
        consumer copying what it is given); the rest through slots."""
        return self.in_place and segment_of(part) is not None

    def buffer(self, seq: int, index: int, nbytes: int) -> torch.Tensor:
        """A slot of at least `nbytes` that every receiver has released (a new one of that size if
        none)."""
        if self._acked[0] != seq:
            self._acked = (seq, 0)
        while self._acked[1] <= index - AHEAD:  # at most AHEAD buckets in flight
            self._read_ack(seq)
        number = self._free_slot(nbytes)
        while number is None and self._acked[1] < index:  # wait for a slot to come free
            self._read_ack(seq)
            number = self._free_slot(nbytes)
        descriptor = None
        if number is None:
            number = self._new_slot(nbytes)
            descriptor = self.slots[number].descriptor()
            self._to_unlink.append((number, index))
        self.handed[number] += 1
        self._next = (number, descriptor)
        return self.slots[number].tensor

    def _read_ack(self, seq: int) -> None:
        """Wait for every receiver's acknowledgement of the oldest bucket not yet acknowledged and
        learn what they released."""
        read = self._acked[1]
        ranks = list(receiver_ranks(self.setup))
        acks = self.control.get_many(
            [ack_key(seq, read, r) for r in ranks], f"every rollout worker to read bucket {read}"
        )
        self.learn(dict(zip(ranks, acks)))
        self._unlink_announced(up_to=read)
        self._acked = (seq, read + 1)

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
        (header.slot, header.new_slot), self._next = self._next or (None, None), None
        if header.slot is None or len(data) > 1:
            self._place(header, data)
        if self.setup.plan.staging == "device":
            stream_done(self.platform)  # the packing copies must land before a receiver reads
        self.control.post(bucket_key(seq, header.index), header)

    def _place(self, header: BucketHeader, data: list[torch.Tensor]) -> None:
        """Each range's place: None (the slot, at the range's own offset) or the segment it lies in
        and its offset there; segments new to the receivers are described."""
        header.places, header.new_segments = [], {}
        for part in data:
            found = None if self._in_slot(header, part) else segment_of(part)
            if found is None:
                header.places.append(None)
                continue
            segment, offset = found
            if segment.key not in self._announced:
                header.new_segments[segment.key] = segment
                self._announced.add(segment.key)
            header.places.append((segment.key, offset))
            self._lent.append(part)

    def _in_slot(self, header: BucketHeader, part: torch.Tensor) -> bool:
        if header.slot is None:
            return False
        return (
            part.untyped_storage().data_ptr() == self.slots[header.slot].tensor.untyped_storage().data_ptr()
        )

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
        self._lent = []
        self._announced = set()  # receivers unmap what a sync did not use: each sync describes its own

    def used_keys(self, seq: int, buckets: int) -> list[str]:
        return [ack_key(seq, i, r) for i in range(buckets) for r in receiver_ranks(self.setup)]

    def close(self) -> None:
        for slot in self.slots:
            slot.unlink()
        self.slots = []


class SlotReceiver:
    lends = True  # a slot is reused only once the sender learns that no tensor of it is held

    def __init__(self, control: Control, setup: Setup, platform: Platform, rank: int) -> None:
        self.control, self.setup, self.platform, self.rank = control, setup, platform, rank
        self.slots: list[ShmSlot | IpcSlot] = []
        self._idle: list[int] = []  # users of each slot's memory when no tensor of ours holds it
        self._released: list[int] = []
        self._held: set[int] = set()
        self.segments = SegmentMaps()

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
            yield header, self._bytes(header)
            if self.setup.plan.staging == "device":
                stream_done(self.platform)  # copies out of the slot are done before it is released
            self.control.post(ack_key(seq, index, self.rank), self.released())
            if header.final:
                return
            index += 1

    def _bytes(self, header: BucketHeader) -> torch.Tensor | Scattered:
        """The bucket's bytes: its slot's; with ranges in the sender's segments, each range where
        it lies."""
        slot = None
        if header.slot is not None:
            self._held.add(header.slot)
            slot = self.slots[header.slot].tensor[: header.nbytes]
        if header.places is None:
            return slot
        for segment in header.new_segments.values():
            self.segments.add(segment)
        return Scattered(
            [
                (
                    start,
                    slot[start:end] if place is None else self.segments.view(place[0], place[1], end - start),
                )
                for (start, end), place in zip(header.ranges, header.places, strict=True)
            ]
        )

    def check_returned(self) -> None:
        """Refuse a sync whose consumer kept views of the sender's segments after its load."""
        kept = self.segments.lent()
        self.segments.end_sync()
        if kept:
            raise WeightSyncError(
                f"the engine still holds {kept} reference(s) to the trainer's shared memory after its load: "
                "on the one-copy path an engine must copy what it receives before `update_weights` "
                "returns (the trainer writes that memory in its next step)"
            )

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
        self.segments.close()
