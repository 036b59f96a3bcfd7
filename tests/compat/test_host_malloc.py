"""roll_device/compat/host_malloc.py: with KEEP_FREED_HOST_MEMORY applied to a running process, a
large block it frees stays with it (re-used by its next allocations); with glibc's defaults the
same block goes back to the system. Each case in its own process (malloc's settings are
process-wide)."""

import os
import subprocess
import sys

from roll_device.compat.host_malloc import apply_malloc_env

# frees a 256 MiB block it has written; prints how much of it left the resident set
FREE_A_BLOCK = """
import ctypes, os, sys
from roll_device.compat.host_malloc import KEEP_FREED_HOST_MEMORY, apply_malloc_env
if sys.argv[1] == "keep":
    assert len(apply_malloc_env(KEEP_FREED_HOST_MEMORY)) == 3
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
block = libc.malloc(256 << 20)
ctypes.memset(block, 1, 256 << 20)
before = resident()
libc.free(block)
print(before - resident())
"""


def returned_bytes(mode: str) -> int:
    # glibc's defaults: none of its variables (a vLLM engine started in this process sets them)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", FREE_A_BLOCK, mode], capture_output=True, text=True, check=True, env=env
    )
    return int(out.stdout)


def test_a_freed_block_stays_with_the_process_only_where_it_keeps_freed_memory():
    assert returned_bytes("default") > 200 << 20
    assert returned_bytes("keep") < 16 << 20


def test_only_mallocs_own_variables_are_applied():
    assert apply_malloc_env({"OMP_NUM_THREADS": "1"}) == []
