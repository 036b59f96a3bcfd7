"""The `torch.npu`-like module of the simulated NPU: devices (and the `device` context manager) and
their facts, synchronize, memory (with `memory` for allocator settings), RNG, streams and events,
mstx markers, the runtime bindings (`cudart()`: host-memory registration), and ACL graphs (`NPUGraph`, `graph`, `graph_pool_handle`).

It stands where torch_npu's `torch.npu` would, with its names and signatures, so that the NPU
platform class runs unmodified. The models behind it live beside it: `devices.py`, `memory.py`,
`streams.py`, `graphs.py`, `markers.py`, `allocator.py`, `runtime.py`, and `errors.py` for the errors a device
raises. Device facts name the simulation: `get_device_name()` is `ROLL_SIM_NPU_NAME` (default
`Ascend910B2`) followed by " (simulated)".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll_device.sim import allocator as memory
from roll_device.sim import errors, graphs, settings, streams
from roll_device.sim.devices import current_index, device_count, device_index, set_current_index
from roll_device.sim.graphs import NPUGraph, graph, graph_pool_handle, is_current_stream_capturing
from roll_device.sim.markers import mstx
from roll_device.sim.memory import LEDGER, total_memory
from roll_device.sim.runtime import cudart
from roll_device.sim.streams import Event, Stream

__all__ = [
    "Event",
    "NPUGraph",
    "Stream",
    "cudart",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "graph",
    "graph_pool_handle",
    "init",
    "ipc_collect",
    "is_available",
    "is_current_stream_capturing",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "mstx",
    "reset_peak_memory_stats",
    "set_device",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "stream",
    "synchronize",
]


def is_available() -> bool:
    return device_count() > 0


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def _lazy_init() -> None:
    """Nothing to initialize: the simulation is ready once installed."""


def init() -> None:
    """As torch_npu's `init`: the simulation is ready once installed."""


def current_device() -> int:
    return current_index()


def set_device(device) -> None:
    set_current_index(device_index(device))


@dataclass(frozen=True)
class NPUDeviceProperties:
    """The fields of torch_npu's device properties that callers read."""

    name: str
    total_memory: int


def get_device_name(device=None) -> str:
    device_index(device)
    return f"{settings.NAME.value()} (simulated)"


def get_device_properties(device=None) -> NPUDeviceProperties:
    return NPUDeviceProperties(name=get_device_name(device), total_memory=total_memory())


class device:
    """Make `device` current inside the block (None or -1: leave the current one), as torch_npu's
    `torch.npu.device` does; Ray's Compiled Graphs wrap every actor task in it."""

    def __init__(self, device) -> None:
        self.index = None if device is None or device == -1 else device_index(device)

    def __enter__(self) -> None:
        self.previous = current_index()
        if self.index is not None:
            set_current_index(self.index)

    def __exit__(self, *exc) -> bool:
        set_current_index(self.previous)
        return False


def synchronize(device=None) -> None:
    """Wait for the device: refused while a graph captures there (work is otherwise synchronous)."""
    if graphs.capture_for(device_index(device)) is not None:
        raise errors.host_sync_in_capture("torch.npu.synchronize()")


def empty_cache() -> None:
    """Give back the cached memory, and that of graph pools no graph uses any more."""
    LEDGER.empty_cache(current_index())


def memory_allocated(device=None) -> int:
    return LEDGER.allocated.get(device_index(device), 0)


def memory_reserved(device=None) -> int:
    return LEDGER.reserved(device_index(device))


def max_memory_allocated(device=None) -> int:
    return LEDGER.peak.get(device_index(device), 0)


def max_memory_reserved(device=None) -> int:
    return LEDGER.peak_reserved.get(device_index(device), 0)


def memory_stats(device=None) -> dict[str, int]:
    return LEDGER.stats(device_index(device))


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """As torch_npu's: a float in [0, 1]; below 1 it caps what this process may reserve on the device."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    LEDGER.fraction[device_index(device)] = fraction


def ipc_collect() -> None:
    """The simulated NPU shares no memory between processes: nothing to collect."""


def reset_peak_memory_stats(device=None) -> None:
    LEDGER.reset_peak(device_index(device))


def mem_get_info(device=None) -> tuple[int, int]:
    total = total_memory()
    return max(total - memory_reserved(device), 0), total


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The autocast dtypes, as torch_npu's: activation checkpointing asks the device module."""
    return [torch.float16, torch.bfloat16]


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)  # simulated tensors draw from the CPU generator


def manual_seed_all(seed: int) -> None:
    """Called by `torch.manual_seed` itself: the CPU generator it seeds is the one used here."""


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    torch.set_rng_state(state)


def get_rng_state_all() -> list[torch.Tensor]:
    """One state per device: every simulated device draws from the one CPU generator."""
    return [torch.get_rng_state() for _ in range(device_count())]


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    set_rng_state(states[current_index()])


def current_stream(device=None) -> Stream:
    return streams.current_stream(device_index(device))


def default_stream(device=None) -> Stream:
    return streams.default_stream(device_index(device))


stream = streams.stream
