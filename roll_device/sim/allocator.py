"""`torch.npu.memory` of the simulated NPU: the allocator settings a running process may change,
and memory history and snapshots under torch_npu's names (`_record_memory_history`, `_snapshot`,
`_dump_snapshot`), from the ledger of `memory.py`.

torch_npu's caching allocator takes `key:value` pairs, comma-separated (the keys it documents for
`PYTORCH_NPU_ALLOC_CONF`), and rejects unknown keys (the wording here is the simulation's).
The simulation models no caching, so the settings change nothing but are checked and kept
(`current_settings()`), so that code toggling expandable segments around sleep runs as on a device.
With no caching, a snapshot's segments are the live storages, one block each.
"""

from __future__ import annotations

import pickle
import sys

from roll_device.sim.devices import device_count
from roll_device.sim.memory import LEDGER

KNOWN_KEYS = (
    "expandable_segments",
    "max_split_size_mb",
    "garbage_collection_threshold",
    "base_addr_aligned_kb",
    "page_size",
)
_settings: dict[str, str] = {}


def _set_allocator_settings(settings: str) -> None:
    for pair in filter(None, (p.strip() for p in settings.split(","))):
        key, sep, value = pair.partition(":")
        if not sep or key.strip() not in KNOWN_KEYS:
            raise RuntimeError(
                f"[simulated NPU] unrecognized allocator setting '{pair}' (keys: {KNOWN_KEYS})"
            )
        _settings[key.strip()] = value.strip()


def current_settings() -> dict[str, str]:
    return dict(_settings)


# torch's split between its small and large pools: a segment above it is "large".
LARGE_SEGMENT_BYTES = 1 << 20


def _record_memory_history(
    enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None
) -> None:
    """torch_npu's signature: `enabled` None stops, "state" keeps the stacks of live storages,
    "all" also records every allocation and free (the last `max_entries`)."""
    LEDGER.record_history(enabled, max_entries)


def _snapshot(device=None) -> dict:
    """Live storages as segments (one block each: nothing is cached) and the recorded events per
    device, under the keys of torch_npu's snapshot."""
    segments = []
    for (index, address), nbytes, pool, frames in LEDGER.live_storages():
        block = {"address": address, "size": nbytes, "requested_size": nbytes, "state": "active_allocated"}
        segments.append(
            {
                "device": index,
                "address": address,
                "total_size": nbytes,
                "allocated_size": nbytes,
                "active_size": nbytes,
                "requested_size": nbytes,
                "stream": 0,
                "segment_type": "large" if nbytes > LARGE_SEGMENT_BYTES else "small",
                "segment_pool_id": pool.id if pool else (0, 0),
                "is_expandable": False,
                "blocks": [{**block, "frames": frames}],
            }
        )
    traces = [[e for e in LEDGER.history if e["device"] == i] for i in range(device_count())]
    return {"segments": segments, "device_traces": traces}


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """`_snapshot()` pickled into `filename` (what pytorch.org/memory_viz opens)."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)
