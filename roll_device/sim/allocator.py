"""`torch.npu.memory` of the simulated NPU: the allocator settings a running process may change.

torch_npu's caching allocator takes `key:value` pairs, comma-separated (the keys it documents for
`PYTORCH_NPU_ALLOC_CONF`), and rejects unknown keys (the wording here is the simulation's).
The simulation models no caching, so the settings change nothing but are checked and kept
(`current_settings()`), so that code toggling expandable segments around sleep runs as on a device.
Allocation history and snapshots are not simulated: those members are absent.
"""

from __future__ import annotations

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
