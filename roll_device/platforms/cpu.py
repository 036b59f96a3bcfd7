"""The CPU as a device kind: gloo collectives, no graphs, no IPC (shared memory instead).

Memory members report the process (resident set size now and at its peak, which the kernel resets
on request) and the machine (available and total RAM), since the CPU has no device allocator of its
own. Profiling ranges are no-ops; device facts and topology describe the host processor and the CPUs
this process may run on; the deep-learning primitives library is oneDNN.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform as host
from dataclasses import dataclass

import torch

from roll_device.platforms.base import Platform
from roll_device.platforms.determinism import Determinism
from roll_device.platforms.device_facts import DeviceFacts
from roll_device.platforms.groups import group
from roll_device.platforms.kernel_env import Kernels
from roll_device.platforms.memory import Memory
from roll_device.platforms.runtime import Runtime
from roll_device.platforms.topology import Topology, numa_nodes

HOST_KIND = "cpu"  # the kind of the host itself: every node has it, its memory is host memory
# Writing this to /proc/self/clear_refs resets the process's peak resident set (VmHWM).
RESET_PEAK_RSS = "5"


@dataclass(frozen=True)
class HostProperties:
    """What the host processor reports, under the names of torch's device properties."""

    name: str
    total_memory: int
    multi_processor_count: int  # the CPUs this process may run on


def process_status(*fields: str) -> dict[str, int]:
    """The `kB` fields of this process's /proc/self/status named in `fields` (VmRSS, VmHWM,
    RssAnon, RssFile, RssShmem, ...), in bytes, from one read: cheap enough for a sampler every
    few milliseconds."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in fields:
                values[key] = int(line.split()[1]) * 1024
    if missing := set(fields) - set(values):
        raise KeyError(f"no {', '.join(sorted(missing))} in /proc/self/status")
    return values


@functools.cache
def _malloc_trim():
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


def release_host_heap() -> None:
    """Give the free memory the C allocator keeps in its heaps back to the OS (glibc's
    `malloc_trim(0)`; nothing where the C library has no such call). Host tensors below glibc's
    mmap threshold (32 MiB at most) are freed into its heaps, which keep the pages: a trainer
    rank of a Qwen2.5-0.5B-shaped model holds hundreds of MiB it no longer uses between steps
    (benchmarks/rank_memory.py)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def host_memory() -> tuple[int, int]:
    """(available, total) bytes of the machine's RAM, from /proc/meminfo."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) * 1024
    return info["MemAvailable"], info["MemTotal"]


class CpuMemory(Memory):
    """The process's resident set stands for the allocator's counters; no device allocator."""

    def memory_reserved(self) -> int:
        return self.platform.memory_allocated()

    def max_memory_reserved(self) -> int:
        return self.platform.max_memory_allocated()

    def memory_stats(self) -> dict[str, int]:
        current = self.platform.memory_allocated()
        peak = max(self.platform.max_memory_allocated(), current)
        return {
            "allocated_bytes.all.current": current,
            "allocated_bytes.all.peak": peak,
            "reserved_bytes.all.current": current,
            "reserved_bytes.all.peak": peak,
        }

    def device_memory_used(self, index: int | None = None) -> int:
        available, total = host_memory()
        return total - available

    def set_memory_fraction(self, fraction: float) -> None:
        self._unsupported("set_memory_fraction", "host memory has no per-process cap here (use cgroups)")

    def ipc_collect(self) -> None:
        """No device IPC handles on the CPU: nothing to collect."""

    def clear_library_workspaces(self) -> None:
        """CPU math libraries keep no device workspaces: nothing to release."""

    def _runtime_call(self, member: str, name: str, *args: object) -> None:
        """The CPU reads host memory directly: registering it (or undoing that) has nothing to do."""


class CpuFacts(DeviceFacts):
    """The host processor, under the names of a device's facts."""

    def device_properties(self, index: int | None = None) -> HostProperties:
        platform = self.platform
        return HostProperties(platform.device_name(), platform.total_memory(), len(os.sched_getaffinity(0)))

    def device_arch(self, index: int | None = None) -> str:
        return host.machine()

    def device_uuid(self, index: int | None = None) -> str:
        self._unsupported("device_uuid", "the host processor has no device UUID")

    def device_index_of_uuid(self, uuid: str) -> int:
        self._unsupported("device_index_of_uuid", "the host processor has no device UUID")


class CpuTopology(Topology):
    """The CPUs this process may run on, and their NUMA node."""

    def cpu_affinity(self, index: int | None = None) -> list[int]:
        """The CPUs this process may run on."""
        return sorted(os.sched_getaffinity(0))

    def set_cpu_affinity(self, index: int | None = None) -> list[int]:
        """The host's CPUs are this process's already: nothing to bind."""
        return self.cpu_affinity()

    def numa_node(self, index: int | None = None) -> int:
        """The NUMA node of the first CPU this process may run on."""
        first = self.cpu_affinity()[0]
        return next((node for node, cpus in sorted(numa_nodes().items()) if first in cpus), 0)


class CpuKernels(Kernels):
    """oneDNN is the CPU's deep-learning primitives library."""

    def set_dnn_library_enabled(self, enabled: bool) -> None:
        torch.backends.mkldnn.enabled = enabled


class CpuDeterminism(Determinism):
    """The host's one generator stands for every device's."""

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [torch.get_rng_state()]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        torch.set_rng_state(states[0])


class CpuRuntime(Runtime):
    """The CPU's runtime is the process itself."""

    def init(self) -> None:
        """The CPU needs no runtime initialisation."""


class CpuPlatform(Platform):
    kind = HOST_KIND
    device_type = "cpu"
    dispatch_key = "CPU"
    ray_resource = None
    visible_devices_env = None
    dist_backend = "gloo"
    collectives_copy_whole = True  # gloo: benchmarks/rank_memory.py
    is_host = True
    memory = group(CpuMemory)
    facts = group(CpuFacts)
    topology = group(CpuTopology)
    kernels = group(CpuKernels)
    determinism = group(CpuDeterminism)
    runtime = group(CpuRuntime)

    @classmethod
    def is_available(cls) -> bool:
        return True

    def device(self, index: int | None = None) -> torch.device:
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def set_device(self, index: int) -> None:
        if index != 0:
            raise ValueError(
                f"platform '{self.name}': device index {index} out of range: the CPU is device 0"
            )

    def synchronize(self) -> None:
        """CPU ops complete before they return: nothing to wait for."""

    def empty_cache(self) -> None:
        """The C allocator's free memory back to the OS (`release_host_heap`)."""
        release_host_heap()

    def memory_allocated(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def max_memory_allocated(self) -> int:
        # The kernel updates the peak lazily: it can trail the resident set just read.
        return max(process_status("VmHWM")["VmHWM"], self.memory_allocated())

    def reset_peak_memory_stats(self) -> None:
        """The peak starts again from the resident set now (Linux resets VmHWM on request)."""
        with open("/proc/self/clear_refs", "w") as f:
            f.write(RESET_PEAK_RSS)

    def mem_get_info(self) -> tuple[int, int]:
        return host_memory()

    def device_name(self, index: int | None = None) -> str:
        return host.processor() or host.machine()

    def total_memory(self, index: int | None = None) -> int:
        return self.mem_get_info()[1]

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)

    def new_event(self, enable_timing: bool = False):
        return torch.cpu.Event()
