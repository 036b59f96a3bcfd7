"""The trainer's side of a weight sync, run on the trainer's rank 0.

```python
sender = WeightSender(plan, platform, receivers=2, options=config.weight_sync)
endpoint = sender.endpoint          # hand it to every rollout worker's WeightReceiver
sender.connect()                    # together with the receivers' connect()
stats = sender.send(trainer.export_weights(), version=step)   # together with their receive()
sender.close()                      # together with theirs
```

`send` cuts the export into buckets as it streams (never the whole model at once), packs each into
a transport buffer unless the transport can send the tensors from where they are, moves them by
the plan's transport, and returns once every receiver has applied them; it raises a
WeightSyncError naming each receiver that failed. If the export itself fails, the receivers are
told (an error header) so that none is left waiting, and the export's exception propagates.

The bucket plan (each bucket's entries: names, dtypes, shapes, offsets) travels once per
connection: a bucket laid out as the same bucket of the previous sync goes with a header without
entries (`entries=None`: "as before"), so that a sync of an unchanged model sends one small
message per bucket. A changed layout (another model, dtype or bucket size) is sent in full.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch

from roll_device.comm.broadcast_transport import BroadcastSender
from roll_device.comm.buckets import BucketWriter, Entry, bucket_size, checksum, pack, tensor_bytes
from roll_device.comm.control import Control, Endpoint, bucket_key, done_key
from roll_device.comm.messages import BucketHeader, SyncStats
from roll_device.comm.options import WeightSyncOptions
from roll_device.comm.planner import SyncPlan
from roll_device.comm.rdt_transport import RdtSender
from roll_device.comm.slot_transport import SlotSender
from roll_device.comm.timing import Stopwatch
from roll_device.comm.transport import SETUP_KEY, SenderTransport, Setup
from roll_device.errors import WeightSyncError
from roll_device.platforms import Platform

SENDERS = {"broadcast": BroadcastSender, "rdt": RdtSender, "shm": SlotSender, "ipc": SlotSender}


class WeightSender:
    def __init__(
        self,
        plan: SyncPlan,
        platform: Platform,
        receivers: int,
        options: WeightSyncOptions,
        host: str = "127.0.0.1",
        control: Control | None = None,
    ) -> None:
        """`options`: the `weight_sync` section (no defaults: the run's config holds them); `host`:
        the address receivers reach this process at (its node's IP across nodes); `control`: a
        namespace of a store served already (one of a sharded sender's links), else a store of
        its own is served."""
        if isinstance(receivers, bool) or not isinstance(receivers, int) or receivers < 1:
            raise WeightSyncError(f"a weight sender needs at least one receiver, got receivers={receivers!r}")
        if platform.kind != plan.src_kind:
            raise WeightSyncError(
                f"the plan syncs from a {plan.src_kind} trainer but this sender runs on {platform.name}"
            )
        self.plan, self.platform = plan, platform
        self.options = options
        self.control = control if control is not None else Control.serve(host, self.options.timeout_s)
        self.setup = Setup(plan, receivers, self.options.bucket_bytes, verify=self.options.verify)
        self.control.put(SETUP_KEY, self.setup)
        self.transport: SenderTransport = SENDERS[plan.transport](self.control, self.setup, platform)
        self.version: int | None = None
        self._seq = 0
        self._plan: dict[int, list[Entry]] = {}  # bucket index -> entries, as the receivers know them

    @property
    def endpoint(self) -> Endpoint:
        return self.control.endpoint

    def connect(self) -> None:
        """Wait for every receiver to connect (they call `connect` at the same time)."""
        self.transport.connect()

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> SyncStats:
        """Send the weights of trainer step `version` (greater than the last one sent)."""
        if self.version is not None and version <= self.version:
            raise WeightSyncError(
                f"weight sync version {version} does not follow the last one sent ({self.version}): "
                "versions are trainer steps and must increase"
            )
        seq, self._seq = self._seq, self._seq + 1
        start = time.perf_counter()
        index = nbytes = 0
        export = Stopwatch()
        try:
            writer = BucketWriter(export.iterate(named_tensors), self.setup.capacity)
            while True:
                entries, parts = writer.take()
                header = BucketHeader(version, index, entries, bucket_size(entries), final=writer.exhausted)
                if self.options.verify:
                    header.checksum = checksum(parts)
                header.ranges, data = self._transfers(seq, index, header, parts)
                known = self._plan.get(index) == entries
                if known:
                    header.entries = None  # the receivers have this bucket's plan from the last sync
                self.transport.send(seq, header, data)
                self._plan[index] = entries
                nbytes += header.nbytes
                index += 1
                if header.final:
                    break
        except Exception as exc:
            self.transport.cancel()
            self._abort(seq, index, version, exc)
            raise
        failures = self._collect(seq, index)
        if failures:
            raise WeightSyncError(
                f"weight sync of version {version} failed on {len(failures)} rollout worker(s): "
                + "; ".join(failures)
            )
        self.version = version
        seconds = time.perf_counter() - start
        return SyncStats(
            version,
            self.plan.path,
            self.plan.transport,
            index,
            writer.tensors,
            nbytes,
            seconds,
            export.seconds,
        )

    def _transfers(
        self, seq: int, index: int, header: BucketHeader, parts: list[torch.Tensor]
    ) -> tuple[list[tuple[int, int]], list[torch.Tensor]]:
        """What moves a bucket: byte ranges of it and the bytes that fill them. A tensor the
        transport sends from where it is goes as it is; each run of the others is packed into a
        transport buffer at its entries' offsets and goes as one range."""
        ranges: list[tuple[int, int]] = []
        data: list[torch.Tensor] = []
        run: list[tuple[Entry, torch.Tensor]] = []
        buffer = None

        def pack_run() -> None:
            nonlocal buffer
            if buffer is None:
                buffer = self.transport.buffer(seq, index, max(header.nbytes, self.setup.capacity))
            start = run[0][0].offset if run else 0
            end = pack([entry for entry, _ in run], [part for _, part in run], buffer).numel()
            ranges.append((start, end))
            data.append(buffer[start:end])
            run.clear()

        for entry, part in zip(header.entries, parts, strict=True):
            if self.transport.sends_in_place(part):
                if run:
                    pack_run()
                ranges.append((entry.offset, entry.offset + entry.nbytes))
                data.append(tensor_bytes(part))
            else:
                run.append((entry, part))
        if run or not data:  # an empty bucket still takes a (slot) buffer: receivers read it
            pack_run()
        return ranges, data

    def _abort(self, seq: int, index: int, version: int, exc: Exception) -> None:
        """Tell the receivers (waiting for bucket `index`) that this sync will not come."""
        header = BucketHeader(version, index, error=f"{type(exc).__name__}: {exc}")
        try:
            self.control.flush()
            self.control.put(bucket_key(seq, index), header)
        except RuntimeError as store_error:  # the control store itself failed: nobody to tell
            exc.add_note(f"the rollout workers could not be told: {store_error}")

    def _collect(self, seq: int, buckets: int) -> list[str]:
        """Every receiver's status (failures, as messages); hands the transport what they released."""
        self.control.flush()
        ranks = list(range(1, self.setup.receivers + 1))
        keys = [done_key(seq, r) for r in ranks]
        statuses = dict(zip(ranks, self.control.get_many(keys, "every rollout worker to apply the weights")))
        self.transport.finish(seq, {r: status["released"] for r, status in statuses.items()})
        used = [bucket_key(seq, i) for i in range(buckets)] + keys + self.transport.used_keys(seq, buckets)
        self.control.discard(used)  # in the background: the sync is done on both ends
        return [
            f"worker {r}: {status['error']}" for r, status in statuses.items() if status["error"] is not None
        ]

    def close(self) -> None:
        """Release buffers and the group (receivers close at the same time on broadcast paths)."""
        self.transport.close()
        self.control.close()
