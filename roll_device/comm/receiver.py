"""A rollout worker's side of a weight sync.

```python
receiver = WeightReceiver(endpoint, rank=1, platform=self.platform)   # ranks 1..receivers
receiver.connect()
stats = receiver.receive(strategy.update_weights)   # any callable taking an iterable of (name, tensor)
receiver.version                                    # the trainer step the weights now come from
```

Everything else (path, transport, bucket size) comes from the sender, so both ends cannot
disagree. `receive` hands `apply` an iterator of (name, tensor) on this worker's device
(`device`); `apply` may keep them as long as it likes. Tensors are views of the received
buckets (no copy) wherever the transport lends its buffers (slots, on the host or a device; host
receive buffers), which are reused only once `apply` let go of every tensor in them; a device
bucket of a transport that reuses its buffers regardless (a broadcast's device ring) is copied
out first. On the one-copy path (a sender's tensors in shared memory, slot_transport.py; only
for a receiver made with `reads_in_place=True`) the tensors are read-only views of the sender's
own memory: `apply` must copy them before it returns, and a sync whose `apply` kept one fails.
Each bucket's entries come once per connection (`BucketHeader.entries` None: as the same bucket
of the previous sync), so the receiver keeps the plan. Without verification buckets are applied as they arrive.
With verification (the sender's `verify`) every bucket is staged and checked first, and a
checksum mismatch raises a WeightSyncError before `apply` sees a single tensor: the engine keeps
the weights of `version`.

On any failure the receiver drains the rest of the sync, so the sender is never left waiting,
reports the failure to the sender, and raises.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from roll_device.comm.broadcast_transport import BroadcastReceiver
from roll_device.comm.buckets import Bucket, Entry, Scattered, checksum, entry_bytes, unpack
from roll_device.comm.control import Control, Endpoint, abort_sync, done_key
from roll_device.comm.messages import BucketHeader, SyncStats
from roll_device.comm.rdt_transport import RdtReceiver
from roll_device.comm.slot_transport import SlotReceiver
from roll_device.comm.timing import Stopwatch
from roll_device.comm.transport import SETUP_KEY, ReceiverTransport, Setup, in_place_key
from roll_device.errors import WeightSyncError
from roll_device.platforms import HOST_KIND, Platform, get_platform

RECEIVERS = {"broadcast": BroadcastReceiver, "rdt": RdtReceiver, "shm": SlotReceiver, "ipc": SlotReceiver}
Apply = Callable[[Iterable[tuple[str, torch.Tensor]]], object]


@dataclass
class _Progress:
    version: int | None = None
    buckets: int = 0
    tensors: int = 0
    nbytes: int = 0


class WeightReceiver:
    def __init__(
        self,
        endpoint: Endpoint,
        rank: int,
        platform: Platform,
        timeout_s: float = 600.0,
        device: torch.device | None = None,
        reads_in_place: bool = False,
        control: Control | None = None,
    ) -> None:
        """`reads_in_place`: the consumer copies every tensor before it returns and keeps none, so
        it may be given views of the sender's own shared memory (the one-copy path); `control`: the
        sync's namespace of the sender's store, connected already (one of a sharded sender's links,
        `Control.within`), else the receiver connects to the endpoint's store at `connect`."""
        self.endpoint, self.rank, self.platform = endpoint, rank, platform
        self.reads_in_place = reads_in_place
        self.timeout_s = timeout_s
        self.device = device if device is not None else platform.device()
        self._host_type = get_platform(HOST_KIND).device_type
        self.version: int | None = None
        self.control: Control | None = control
        self.transport: ReceiverTransport | None = None
        self._seq = 0
        self._plan: dict[int, list[Entry]] = {}  # bucket index -> entries, as the sender sent them

    def connect(self, path: str | None = None) -> None:
        """Join the sender (which calls `connect` at the same time); `path`: the sync path this
        receiver serves, checked against the sender's plan before any group is joined (a refusal
        is told to the sender through the control store)."""
        if self.control is None:
            self.control = Control.connect(self.endpoint, self.timeout_s)
        setup: Setup = self.control.get(SETUP_KEY, "the sender's setup")
        if path is not None and setup.plan.path != path:
            reason = (
                f"receiver rank {self.rank} serves the {path} path but the trainer's sender plans "
                f"{setup.plan.describe()}: both ends take the path of one run plan"
            )
            abort_sync(self.endpoint, reason)
            raise WeightSyncError(reason)
        if not 1 <= self.rank <= setup.receivers:
            raise WeightSyncError(
                f"receiver rank {self.rank} is out of range: the sender expects ranks 1..{setup.receivers}"
            )
        if self.platform.kind != setup.plan.dst_kind:
            raise WeightSyncError(
                f"the sender's plan syncs into {setup.plan.dst_kind} rollout workers but this one runs "
                f"on {self.platform.name}"
            )
        self.plan = setup.plan
        self.control.put(in_place_key(self.rank), self.reads_in_place)
        self.transport = RECEIVERS[setup.plan.transport](self.control, setup, self.platform, self.rank)
        self.transport.connect()

    def receive(self, apply: Apply) -> SyncStats:
        """Receive the next sync and hand its tensors to `apply`; returns once they are applied."""
        if self.transport is None:
            raise WeightSyncError("WeightReceiver.receive before connect(): connect to the sender first")
        seq, self._seq = self._seq, self._seq + 1
        start = time.perf_counter()
        stream = self.transport.buckets(seq)
        progress = _Progress()
        waits = Stopwatch()
        try:
            named = waits.iterate(self._named(stream, progress))
            apply(named)
            if next(named, None) is not None:
                raise WeightSyncError(
                    f"the apply callable returned after {progress.tensors - 1} tensors, before the end "
                    "of the sync: it must consume every (name, tensor) it is given"
                )
            del named  # the last tensor handed over goes with it
            self.transport.check_returned()
        except Exception as exc:
            with contextlib.suppress(WeightSyncError):
                for header, _ in stream:  # drain, so that the sender is not left waiting
                    self._learn_plan(header)  # and keep the plan the sender believes we have
            self._report(seq, f"{type(exc).__name__}: {exc}")
            raise
        self._report(seq, None)
        self.version = progress.version
        seconds = time.perf_counter() - start
        return SyncStats(
            progress.version,
            self.plan.path,
            self.plan.transport,
            progress.buckets,
            progress.tensors,
            progress.nbytes,
            seconds,
            load_s=max(seconds - waits.seconds, 0.0),
        )

    def _report(self, seq: int, error: str | None) -> None:
        """This receiver's status for the sender: its error, if any, and what it released."""
        self.control.flush()  # acknowledgements first
        self.control.put(done_key(seq, self.rank), {"error": error, "released": self.transport.released()})

    def _named(
        self, stream: Iterator[tuple[BucketHeader, torch.Tensor | None]], progress: _Progress
    ) -> Iterator[tuple[str, torch.Tensor]]:
        staged: list[tuple[BucketHeader, torch.Tensor]] = []
        for header, data in stream:
            progress.version = header.version
            self._learn_plan(header)
            if header.error is not None:
                kept = "keeps its previous weights" if not progress.tensors else "has been partly updated"
                raise WeightSyncError(
                    f"the trainer aborted the weight sync of version {header.version} ({header.error}); "
                    f"this rollout worker {kept}"
                )
            if header.checksum is not None:
                self._verify(header, data)
            progress.buckets += 1
            progress.nbytes += header.nbytes
            if header.checksum is not None:
                staged.append((header, data.to(self.device, copy=True)))
            else:
                yield from self._unpack(header, self._local(data), progress)
            del data  # the transport may reuse the buffer once the consumer lets go of it too
        for header, data in staged:
            yield from self._unpack(header, data, progress)

    def _learn_plan(self, header: BucketHeader) -> None:
        """`header.entries` from the plan when the sender left them out; the plan updated when it
        sent them."""
        if header.error is not None:
            return
        if header.entries is not None:
            self._plan[header.index] = header.entries
            return
        if header.index not in self._plan:
            raise WeightSyncError(
                f"bucket {header.index} of the weight sync of version {header.version} came without its "
                "layout and this receiver never got one: the sender and this receiver disagree on "
                "what was sent before (reconnect both ends)"
            )
        header.entries = self._plan[header.index]

    def _local(self, data: Bucket) -> Bucket:
        """The bucket on this worker's device: the transport's buffer itself when it is on this
        device and either host memory or lent by the transport (reused only once nothing holds
        it), else a copy."""
        if isinstance(data, Scattered):  # ranges in the sender's segments: host memory
            return data if self.device.type == self._host_type else data.to(self.device, copy=True)
        if data.device.type == self._host_type and self.device.type == self._host_type:
            return data
        same_device = data.device.type == self.device.type and self.device.index in (None, data.device.index)
        if self.transport.lends and same_device:
            return data
        return data.to(self.device, copy=True)

    def _unpack(self, header: BucketHeader, data: torch.Tensor, progress: _Progress):
        for item in unpack(header.entries, data):
            progress.tensors += 1
            yield item

    def _verify(self, header: BucketHeader, data: torch.Tensor) -> None:
        got = checksum(entry_bytes(header.entries, data))
        if got != header.checksum:
            raise WeightSyncError(
                f"bucket {header.index} of the weight sync of version {header.version} failed its "
                f"checksum (sent {header.checksum:08x}, received {got:08x}); nothing was applied: "
                f"this rollout worker keeps the weights of version {self.version}"
            )

    def close(self) -> None:
        """Release the slots or the group (together with the sender on broadcast paths)."""
        if self.transport is not None:
            self.transport.close()
            self.control.close()
