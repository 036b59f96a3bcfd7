"""`platform.profiling`: named ranges and marks, the capture-range profiler switch, and the kind's
`torch.profiler` activity and profiler.

Ranges go to the kind's marker API: NVTX (`torch.cuda.nvtx`) on CUDA and ROCm (roctx behind the
same calls), mstx (`torch.npu.mstx`, torch_npu's `range_start`/`range_end`/`mark`) on Ascend;
a kind without one (the CPU) treats them as no-ops, so instrumented code runs everywhere.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any, ClassVar, Protocol

from roll_device.platforms.groups import PlatformGroup


class RangeMarker(Protocol):
    """A vendor marker API, reached through the kind's torch device module."""

    def start(self, module: ModuleType, message: str) -> Any: ...

    def end(self, module: ModuleType, token: Any) -> None: ...

    def mark(self, module: ModuleType, message: str) -> None: ...


class NvtxMarker:
    """NVTX: a per-thread stack of ranges (`range_push` / `range_pop`)."""

    def start(self, module: ModuleType, message: str) -> Any:
        module.nvtx.range_push(message)

    def end(self, module: ModuleType, token: Any) -> None:
        module.nvtx.range_pop()

    def mark(self, module: ModuleType, message: str) -> None:
        module.nvtx.mark(message)


class MstxMarker:
    """mstx: `range_start` returns an id that `range_end` closes."""

    def start(self, module: ModuleType, message: str) -> Any:
        return module.mstx.range_start(message)

    def end(self, module: ModuleType, token: Any) -> None:
        module.mstx.range_end(token)

    def mark(self, module: ModuleType, message: str) -> None:
        module.mstx.mark(message)


class Profiling(PlatformGroup):
    """The profiling group; kinds name a subclass that sets the class attributes."""

    attribute = "profiling"
    range_marker: ClassVar[RangeMarker | None] = None
    # The package whose `profile` and `ProfilerActivity` serve this kind, and the activity's name.
    profiler_package: ClassVar[str] = "torch.profiler"
    profiler_activity_name: ClassVar[str] = "CPU"
    # Whether `torch.<device>.profiler.start/stop` open a capture range (cudaProfilerStart).
    supports_capture_range: ClassVar[bool] = False

    _open_ranges = threading.local()  # per thread: platform name -> tokens of its open ranges

    def _range_stack(self) -> list:
        stacks = self._open_ranges.__dict__.setdefault("stacks", {})
        return stacks.setdefault(self.platform.name, [])

    def range_push(self, message: str) -> None:
        """Open a named range on this thread (a no-op where the kind has no marker API)."""
        marker = self.range_marker
        token = marker.start(self.platform.device_module(), message) if marker else None
        self._range_stack().append(token)

    def range_pop(self) -> None:
        """Close the range this thread opened last."""
        stack = self._range_stack()
        if not stack:
            raise RuntimeError(f"platform '{self.platform.name}': range_pop without an open range")
        token = stack.pop()
        if self.range_marker:
            self.range_marker.end(self.platform.device_module(), token)

    @contextlib.contextmanager
    def range(self, message: str) -> Iterator[None]:
        """A named range around the block."""
        self.range_push(message)
        try:
            yield
        finally:
            self.range_pop()

    def mark(self, message: str) -> None:
        """An instantaneous named marker (a no-op where the kind has no marker API)."""
        if self.range_marker:
            self.range_marker.mark(self.platform.device_module(), message)

    def profiler_start(self) -> None:
        """Open the capture range of an external profiler (Nsight Systems `--capture-range`)."""
        self._capture_profiler("profiler_start").start()

    def profiler_stop(self) -> None:
        self._capture_profiler("profiler_stop").stop()

    def _capture_profiler(self, member: str) -> ModuleType:
        if not self.supports_capture_range:
            self._unsupported(member, "no capture-range profiler API on this kind: use profiling.profile()")
        return self.platform.device_module().profiler

    def profiler_module(self) -> ModuleType:
        """The profiler package of this kind (`torch.profiler`, or torch_npu's on Ascend)."""
        self.platform.device_module()  # loads the kind's package first (torch_npu)
        return importlib.import_module(self.profiler_package)

    def profiler_activity(self) -> Any:
        """This kind's device activity (`ProfilerActivity.CUDA`, `.NPU`; `.CPU` on the CPU)."""
        return getattr(self.profiler_module().ProfilerActivity, self.profiler_activity_name)

    def profile(self, activities: Sequence[str] = ("cpu", "device"), **kwargs: Any) -> Any:
        """A profiler recording `activities`: `cpu` the host, `device` this kind's device (the
        host again on the CPU); kwargs go to its `profile`."""
        module = self.profiler_module()
        chosen = {"cpu": module.ProfilerActivity.CPU, "device": self.profiler_activity()}
        unknown = set(activities) - set(chosen)
        if unknown:
            raise ValueError(
                f"platform '{self.platform.name}': unknown profiler activities {sorted(unknown)}"
            )
        return module.profile(activities=list(dict.fromkeys(chosen[a] for a in activities)), **kwargs)

    def export_trace(self, profile: Any, path: str) -> None:
        """Write a finished `profile` as a Chrome trace (Perfetto, chrome://tracing) at `path`."""
        profile.export_chrome_trace(path)
