"""glibc malloc's tunables, applied to the running process as its environment would at start.

glibc reads `MALLOC_MMAP_MAX_`, `MALLOC_TRIM_THRESHOLD_` and `MALLOC_TOP_PAD_` once, when the process
starts: processes started later (an engine's worker processes) take them from the environment, and
`apply_malloc_env(env)` gives the process that is already running the same settings with
`mallopt`. Nothing where the C library has no `mallopt` (not glibc).

`KEEP_FREED_HOST_MEMORY` makes a process keep the host memory it frees for its next allocations
instead of returning it to the system (no block of its own mapping, no trimming): a process that
frees and re-allocates the same large tensors over and over (vLLM's layerwise reload, every
weight update) then re-uses pages already faulted in (benchmarks/vllm_receive.py measures it).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

# mallopt's parameter numbers (glibc's malloc.h) for the variables of the same meaning
_PARAMS = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_TOP_PAD_": -2, "MALLOC_MMAP_MAX_": -4}
KEEP_FREED_HOST_MEMORY = {
    "MALLOC_MMAP_MAX_": "0",  # every block from the heap, none mapped (and unmapped) on its own
    "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1),  # free memory at the heap's top stays (mallopt's most)
    "MALLOC_TOP_PAD_": str(512 * 2**20),  # the heap grows in large steps
}


def apply_malloc_env(env: Mapping[str, str]) -> list[str]:
    """`mallopt` for each glibc malloc variable in `env`; the ones applied."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return []
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    applied = []
    for name, param in _PARAMS.items():
        if name in env and mallopt(param, int(env[name])) == 1:
            applied.append(name)
    return applied
