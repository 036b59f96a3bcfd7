"""The broadcast transport: buckets move by a process-group broadcast from the sender.

The header goes through the control store, the bytes by an asynchronous
broadcast from rank 0 in a group of their own (the kind's backend for `collective`, gloo for the
host bridge), in messages of at most 16 MiB. Tensors of 1 MiB or more already on the group's
device are broadcast from their own memory; each run of the others is packed into a buffer of a
ring and broadcast as one range; at most `AHEAD` buckets are in flight. Each receiver posts the
next buckets (up to `AHEAD`) before it hands bucket i over, into host buffers nothing holds
(host receive buffers) or into a ring of device buffers (which receivers copy out of before
use); either way the bucket's layout is the same.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import torch

from roll_device.comm.buffers import HostPool, host_buffer
from roll_device.comm.control import Control, bucket_key
from roll_device.comm.groups import broadcast_bytes, close_group, new_group
from roll_device.comm.messages import BucketHeader
from roll_device.comm.transport import AHEAD, Setup
from roll_device.platforms import HOST_KIND, Platform, get_platform

IN_PLACE_BYTES = 1 << 20  # tensors this large on the group's device are broadcast without packing


def _host_staged(setup: Setup, platform: Platform) -> bool:
    """Whether this side's bucket buffers live in host memory."""
    return setup.plan.staging == "host" or platform.device_type == get_platform(HOST_KIND).device_type


def _group_device(setup: Setup, platform: Platform) -> torch.device:
    return platform.device() if setup.plan.staging == "device" else get_platform(HOST_KIND).device()


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
        its own memory (smaller ones are cheaper to pack than to send one by one; a non-contiguous one
        is packed, which copies it once)."""
        return (
            part.device == self.device
            and part.is_contiguous()
            and part.numel() * part.element_size() >= IN_PLACE_BYTES
        )

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
        self.lends = False

    def connect(self) -> None:
        self.device = _group_device(self.setup, self.platform)
        self.lends = _host_staged(self.setup, self.platform)  # host buffers: reused once free
        if self.lends:
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

    def check_returned(self) -> None:
        """Nothing lent is the sender's: the consumer may keep what it was given."""

    def close(self) -> None:
        if self.group is not None:
            close_group(self.group, self.device)
            self.group = None
