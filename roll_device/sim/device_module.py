"""The `torch.npu`-like module of the simulated NPU: device count, current device, synchronize,
memory accounting of live simulated tensors, RNG seeding, streams and events as no-ops.

It stands where torch_npu's `torch.npu` would, so that the NPU platform class runs unmodified.
It offers no graph class: the simulation does not model ACL graphs.
"""

from __future__ import annotations

import contextlib
import os

import torch

from roll_device.sim import tensor as _t

DEFAULT_COUNT = 8
DEFAULT_MEMORY_BYTES = 64 << 30


def device_count() -> int:
    return int(os.environ.get("ROLL_SIM_NPU_COUNT", DEFAULT_COUNT))


def total_memory() -> int:
    return int(os.environ.get("ROLL_SIM_NPU_MEMORY_BYTES", DEFAULT_MEMORY_BYTES))


def _index(device=None) -> int:
    if device is None:
        return _t.current_index()
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        index = device.index if device.index is not None else _t.current_index()
    if not 0 <= index < device_count():
        raise RuntimeError(
            f"simulated npu:{index} does not exist: ROLL_SIM_NPU_COUNT={device_count()} "
            "(raise it, or pick an index below it)"
        )
    return index


def is_available() -> bool:
    return device_count() > 0


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def current_device() -> int:
    return _t.current_index()


def set_device(device) -> None:
    _t.set_current_index(_index(device))


def synchronize(device=None) -> None:
    _index(device)  # validates; CPU compute is already synchronous


def empty_cache() -> None:
    """Nothing cached: the simulation frees storages when their tensors die."""


def memory_allocated(device=None) -> int:
    return _t.LEDGER.allocated.get(_index(device), 0)


def memory_reserved(device=None) -> int:
    return memory_allocated(device)


def max_memory_allocated(device=None) -> int:
    return _t.LEDGER.peak.get(_index(device), 0)


def reset_peak_memory_stats(device=None) -> None:
    _t.LEDGER.reset_peak(_index(device))


def mem_get_info(device=None) -> tuple[int, int]:
    total = total_memory()
    return max(total - memory_allocated(device), 0), total


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)  # simulated tensors draw from the CPU generator


def manual_seed_all(seed: int) -> None:
    """Called by `torch.manual_seed` itself: the CPU generator it seeds is the one used here."""


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    torch.set_rng_state(state)


class Stream:
    """A stream that orders nothing: every simulated op runs synchronously on the CPU."""

    def __init__(self, device=None, priority: int = 0) -> None:
        self.device = torch.device(_t.DEVICE_TYPE, _index(device))

    def synchronize(self) -> None:
        pass

    def wait_stream(self, other: Stream) -> None:
        pass

    def wait_event(self, event: Event) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event


class Event:
    """An event that is complete as soon as it is recorded."""

    def __init__(self, enable_timing: bool = False) -> None:
        self._recorded = False

    def record(self, stream: Stream | None = None) -> None:
        self._recorded = True

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait(self, stream: Stream | None = None) -> None:
        pass


_default_stream: dict[int, Stream] = {}


def current_stream(device=None) -> Stream:
    index = _index(device)
    if index not in _default_stream:
        _default_stream[index] = Stream(index)
    return _default_stream[index]


@contextlib.contextmanager
def stream(s: Stream | None):
    yield s


def _lazy_init() -> None:
    pass
