"""Device memory of the simulated NPU: live storages per device, graph memory pools, and a capacity.

What a user of torch_npu's caching allocator observes:
- `allocated`: bytes of the storages of live simulated tensors (views of one storage count once);
- the cache: bytes of freed storages outside graph pools stay reserved, as the caching allocator
  keeps freed blocks, until `empty_cache()` gives them back to the device; a later allocation
  outside pools takes from them first (any cached byte serves any request: no block sizes, no
  fragmentation, so reserved memory is a lower bound of the real allocator's);
- graph pools: storages allocated while a graph captures on its device come from that graph's pool.
  A pool's footprint is the most it ever held at once, so graphs that share a pool (captured largest
  first) share its memory; it stays reserved while a graph uses it, and after the last one is reset
  until `empty_cache()`, as torch's allocator keeps a released pool's blocks until then;
- `reserved` (and what `mem_get_info` reports as used): allocations outside pools, the cache, and
  every pool's footprint;
- an allocation that would take `reserved` past the capacity (`ROLL_SIM_NPU_MEMORY_BYTES`, default
  64 GiB, times the process's fraction once `set_per_process_memory_fraction` set one) raises
  `torch.OutOfMemoryError` with torch_npu's wording (the device's total capacity, and what the
  fraction allows beside it), before any memory is taken;
- a storage resized in place, by an op or directly (`UntypedStorage.resize_`, as FSDP2 and the
  colocated turns shrink storages to nothing and regrow them), gives its bytes back to the cache or
  takes them, as torch_npu's allocator frees and allocates the storage's block;
- `memory_stats()` reports these counters under torch's names, current and peak;
- while memory history records ("state": the stacks of live storages; "all": also every storage
  taken or given back, as torch's `alloc` / `free_completed` trace entries, with their stacks),
  a snapshot shows live storages as segments, each with the stack that allocated them.
"""

from __future__ import annotations

import itertools
import threading
import traceback
import weakref
from collections import deque

from roll_device.sim import errors, settings


def total_memory() -> int:
    return settings.MEMORY_BYTES.value()


class Pool:
    """A graph memory pool on one device: what its graphs' captures allocated."""

    _ids = itertools.count(1)

    def __init__(self, index: int, handle: tuple[int, int] | None = None) -> None:
        self.index = index
        # As torch: a private pool's id sets the first value, a graph_pool_handle() the second.
        self.id = handle or (next(Pool._ids), 0)
        self.live = 0  # bytes of live storages allocated from it
        self.peak = 0  # its footprint: the most it held at once (until empty_cache once unused)
        self.users = 0  # graphs captured into it and not reset


class MemoryLedger:
    """Bytes held by live simulated storages and graph pools, per device index."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._live: dict[tuple[int, int], list] = {}  # (device, storage key) -> [nbytes, refs, pool]
        self._outside: dict[int, int] = {}  # bytes of live storages outside any pool
        self._cached: dict[int, int] = {}  # bytes freed outside pools, reserved until empty_cache
        self._pools: dict[tuple[int, int], Pool] = {}
        self.allocated: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.peak_reserved: dict[int, int] = {}
        self.fraction: dict[int, float] = {}
        self.history: deque = deque()  # allocation events, recorded while `recording` is "all"
        self.recording: str | None = None  # None, "state" or "all", as torch_npu's `enabled`
        self.frames: dict[tuple[int, int], list[dict]] = {}  # live storage -> its allocation stack

    def capacity(self, index: int) -> int:
        """Bytes this process may reserve on device `index`: the device's, or the part of them the
        fraction set for it allows (as torch_npu's allocator computes it)."""
        fraction = self.fraction.get(index)
        return total_memory() if fraction is None else int(fraction * total_memory())

    def stats(self, index: int) -> dict[str, int]:
        """The counters under the names of torch's `memory_stats()`."""
        with self._lock:
            return {
                "allocated_bytes.all.current": self.allocated.get(index, 0),
                "allocated_bytes.all.peak": self.peak.get(index, 0),
                "reserved_bytes.all.current": self.reserved(index),
                "reserved_bytes.all.peak": self.peak_reserved.get(index, 0),
            }

    # ---- pools --------------------------------------------------------------------------------
    def pool(self, index: int, handle: tuple[int, int] | None = None) -> Pool:
        """The pool of `handle` on `index` (created on first use), or a new private pool."""
        with self._lock:
            pool = self._pools.get(handle) if handle else None
            if pool is None:
                pool = Pool(index, handle)
                self._pools[pool.id] = pool
            return pool

    def empty_cache(self, index: int) -> None:
        """Give back the cache, and what pools no graph uses any more hold beyond their live storages."""
        with self._lock:
            self._cached[index] = 0
            for key, pool in list(self._pools.items()):
                if pool.index == index and not pool.users:
                    pool.peak = pool.live
                    if not pool.live:
                        del self._pools[key]

    # ---- storages -----------------------------------------------------------------------------
    def reserved(self, index: int) -> int:
        with self._lock:
            pools = sum(p.peak for p in self._pools.values() if p.index == index)
            return self._outside.get(index, 0) + self._cached.get(index, 0) + pools

    def track(self, wrapper, key: tuple[int, int], nbytes: int, pool: Pool | None) -> weakref.finalize:
        """Count the storage `key` while `wrapper` (or another tracked tensor on it) lives; returns
        the release, which `wrapper` calls itself when it lets go of the storage before it dies.
        Raises `torch.OutOfMemoryError` when a new storage does not fit the device."""
        index = key[0]
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                self._take(index, nbytes, pool)
                entry = self._live[key] = [nbytes, 0, pool]
                self._record("alloc", key, nbytes, pool)
            entry[1] += 1
        return weakref.finalize(wrapper, self._release, key)

    def _take(self, index: int, nbytes: int, pool: Pool | None) -> None:
        cached = self._cached.get(index, 0) if pool is None else 0
        growth = max(nbytes - cached, 0) if pool is None else max(pool.live + nbytes - pool.peak, 0)
        reserved = self.reserved(index)
        if growth and reserved + growth > self.capacity(index):
            raise errors.out_of_memory(
                index,
                nbytes,
                total_memory(),
                self.fraction.get(index),
                self.allocated.get(index, 0),
                reserved,
            )
        if pool is None:
            self._outside[index] = self._outside.get(index, 0) + nbytes
            self._cached[index] = cached - (nbytes - growth)
        else:
            pool.live += nbytes
            pool.peak = max(pool.peak, pool.live)
        self.allocated[index] = self.allocated.get(index, 0) + nbytes
        self.peak[index] = max(self.peak.get(index, 0), self.allocated[index])
        self.peak_reserved[index] = max(self.peak_reserved.get(index, 0), reserved + growth)

    def resize(self, key: tuple[int, int], nbytes: int) -> None:
        """A live storage grew or shrank in place (`resize_`, an `out=` result resized by its kernel)."""
        with self._lock:
            entry = self._live.get(key)
            if entry is None or entry[0] == nbytes:
                return
            old, _, pool = entry
            if nbytes > old:
                self._take(key[0], nbytes - old, pool)
            else:
                self._give(key[0], old - nbytes, pool)
            entry[0] = nbytes

    def storage_resized(self, cdata: int, nbytes: int) -> None:
        """A storage resized directly (`UntypedStorage.resize_`) grew or shrank: counted as `resize`
        counts it, on whichever device holds a live storage with the C identity `cdata`."""
        with self._lock:
            indices = [index for index in self.allocated if (index, cdata) in self._live]
        for index in indices:
            self.resize((index, cdata), nbytes)

    def _release(self, key: tuple[int, int]) -> None:
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1]:
                return
            del self._live[key]
            nbytes, _, pool = entry
            self._give(key[0], nbytes, pool)
            self._record("free_completed", key, nbytes, pool)

    def _give(self, index: int, nbytes: int, pool: Pool | None) -> None:
        self.allocated[index] -= nbytes
        if pool is None:
            self._outside[index] -= nbytes
            self._cached[index] = self._cached.get(index, 0) + nbytes
        else:
            pool.live -= nbytes

    def record_history(self, enabled: str | None, max_entries: int) -> None:
        """Record from now on ("state": stacks of live storages; "all": also the last `max_entries`
        events), or stop (None; what was recorded stays for the next snapshot)."""
        if enabled not in (None, "state", "all"):
            raise ValueError(
                f"[simulated NPU] memory history 'enabled' must be None, 'state' or 'all', not {enabled!r}"
            )
        with self._lock:
            if enabled == "all":
                self.history = deque(self.history, maxlen=max(max_entries, 1))
            self.recording = enabled

    def _record(self, action: str, key: tuple[int, int], nbytes: int, pool: Pool | None) -> None:
        if self.recording is None:
            self.frames.pop(key, None)
            return
        frames = [
            {"filename": f.filename, "line": f.lineno, "name": f.name} for f in traceback.extract_stack()[:-3]
        ]
        if action == "alloc":
            self.frames[key] = frames
        else:
            self.frames.pop(key, None)
        if self.recording == "all":
            pool_id = pool.id if pool else (0, 0)
            self.history.append(
                {
                    "action": action,
                    "device": key[0],
                    "addr": key[1],
                    "size": nbytes,
                    "stream": 0,
                    "pool_id": pool_id,
                    "frames": frames,
                }
            )

    def live_storages(self) -> list[tuple[tuple[int, int], int, Pool | None, list[dict]]]:
        """(key, bytes, pool, allocation stack: empty where none was recorded) of every live storage."""
        with self._lock:
            return [(key, entry[0], entry[2], self.frames.get(key, [])) for key, entry in self._live.items()]

    def reset_peak(self, index: int) -> None:
        with self._lock:
            self.peak[index] = self.allocated.get(index, 0)
            self.peak_reserved[index] = self.reserved(index)


LEDGER = MemoryLedger()
