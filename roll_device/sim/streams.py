"""Streams and events of the simulated NPU, and the device's stream budget.

Work is synchronous (every op completes before it returns), so streams order nothing; what they
model is which stream is current (graph capture records the work issued on its stream) and how
many of the device's streams are taken. An Ascend device has a fixed number of streams (vLLM-Ascend
counts 2,048; `ROLL_SIM_NPU_STREAMS` here): the default stream takes one, torch_npu's pool of side
streams (`STREAMS_PER_DEVICE`, 8 or 32, default 32) takes its size once the first side stream is
created (`Stream()` objects share the pool round robin), and every captured graph holds one until
it is reset. A capture that finds none left fails as the device does (CANN error 207008).
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from roll_device.sim import errors, settings
from roll_device.sim.devices import DEVICE_TYPE, current_index, device_index, set_current_index

POOL_SIZES = (8, 32)
DEFAULT_POOL_SIZE = 32

log = logging.getLogger(__name__)


def device_streams() -> int:
    return settings.STREAMS.value()


def pool_size() -> int:
    """torch_npu's side-stream pool size: 8 or 32; any other value warns and means 32."""
    raw = os.environ.get("STREAMS_PER_DEVICE", str(DEFAULT_POOL_SIZE))
    if raw.strip() in {str(n) for n in POOL_SIZES}:
        return int(raw)
    log.warning(
        "STREAMS_PER_DEVICE=%s is not 8 or 32: the stream pool keeps %d streams", raw, DEFAULT_POOL_SIZE
    )
    return DEFAULT_POOL_SIZE


class _Budget:
    """Streams taken per device: the default stream, the side-stream pool, one per graph."""

    def __init__(self) -> None:
        self.pool: dict[int, int] = {}  # device -> pool size, once a side stream exists
        self.graphs: dict[int, int] = {}

    def open_pool(self, index: int) -> None:
        self.pool.setdefault(index, pool_size())

    def take_graph_stream(self, index: int) -> None:
        graphs = self.graphs.get(index, 0)
        needed = 1 + self.pool.get(index, 0) + graphs + 1
        if needed > device_streams():
            raise errors.streams_exhausted(needed, device_streams(), graphs)
        self.graphs[index] = graphs + 1

    def give_graph_stream(self, index: int) -> None:
        self.graphs[index] -= 1


BUDGET = _Budget()


class Stream:
    """A stream of the simulated NPU (a side stream unless it is a device's default stream)."""

    def __init__(self, device=None, priority: int = 0, *, default: bool = False) -> None:
        self.device = torch.device(DEVICE_TYPE, device_index(device))
        self.is_default = default
        self.capturing = None  # the capture under way on this stream, set by the graph module
        if not default:
            BUDGET.open_pool(self.device.index)

    def synchronize(self) -> None:
        if self.capturing is not None:
            raise errors.host_sync_in_capture("Stream.synchronize()")

    def wait_stream(self, other: Stream) -> None:
        """Nothing to wait for: work is synchronous."""

    def wait_event(self, event: Event) -> None:
        """Nothing to wait for: work is synchronous."""

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        kind = "default" if self.is_default else "side"
        return f"<simulated npu Stream ({kind}) on {self.device}>"


class Event:
    """An event that is complete as soon as it is recorded."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self.recorded = False

    def record(self, stream: Stream | None = None) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        """Complete at once: work is synchronous."""

    def query(self) -> bool:
        return True

    def wait(self, stream: Stream | None = None) -> None:
        """Nothing to wait for: work is synchronous."""


_default: dict[int, Stream] = {}
_current: dict[int, Stream] = {}


def default_stream(index: int) -> Stream:
    if index not in _default:
        _default[index] = Stream(index, default=True)
    return _default[index]


def current_stream(index: int) -> Stream:
    return _current.get(index) or default_stream(index)


@contextlib.contextmanager
def stream(s: Stream | None):
    """Make `s` the current stream of its device, and its device the current one, inside the block
    (as `torch.cuda.stream` does; None: leave both as they are)."""
    if s is None:
        yield s
        return
    index, device = s.device.index, current_index()
    previous = _current.get(index)
    _current[index] = s
    set_current_index(index)
    try:
        yield s
    finally:
        set_current_index(device)
        if previous is None:
            _current.pop(index, None)
        else:
            _current[index] = previous
