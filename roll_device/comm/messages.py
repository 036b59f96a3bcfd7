"""What one weight sync says about itself: a header per bucket, and the statistics of a sync."""

from __future__ import annotations

from dataclasses import dataclass, field

from roll_device.comm.buckets import Entry


@dataclass
class BucketHeader:
    """Bucket `index` of the sync of trainer step `version`: its entries (None: the same as bucket
    `index` of the previous sync on this connection, the plan sent once), its size in bytes, the
    slot that holds it (slot transports; `new_slot` describes a slot made for it), the byte ranges
    that travel one by one (broadcast transport: a large tensor from the sender's own memory, each
    run of small ones packed; shared memory: `places` says, per range, None for the slot or the
    (segment key, byte offset) it lies at, and `new_segments` describes the segments first used
    here), its CRC32 when verification is on, whether it is the last one, and the sender's error
    when the sender aborted instead (no bytes follow)."""

    version: int
    index: int
    entries: list[Entry] | None = field(default_factory=list)
    nbytes: int = 0
    slot: int | None = 0
    new_slot: tuple | None = None
    ranges: list[tuple[int, int]] = field(default_factory=list)
    places: list[tuple | None] | None = None
    new_segments: dict | None = None
    checksum: int | None = None
    final: bool = False
    error: str | None = None

    @property
    def ends(self) -> bool:
        return self.final or self.error is not None


@dataclass(frozen=True)
class SyncStats:
    """One finished sync, as either side saw it. `export_s`: the sender's seconds inside the
    export (casts and gathers included); `load_s`: the receiver's seconds in the engine's load
    (its `apply`, less the waits for the transport); the rest of `seconds` is the transfer."""

    version: int
    path: str
    transport: str
    buckets: int
    tensors: int
    nbytes: int
    seconds: float
    export_s: float = 0.0
    load_s: float = 0.0

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0
