"""A process's host memory per phase of its work, for the memory benchmarks: /proc/self/status
sampled every 2 ms by a thread (`PhaseMeter`), glibc malloc's own account (`glibc_account`), what
`malloc_trim(0)` would give back now (`trimmable`), and the train step's phases marked from inside
torch (`instrument`)."""

from __future__ import annotations

import ctypes
import threading
import time

from roll_device.platforms import process_status, release_host_heap

FIELDS = ("RssAnon", "RssFile", "RssShmem")


class Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def glibc_account() -> dict[str, int]:
    """glibc malloc's bytes over all its arenas: in use (`in_use`), free but kept (`kept`), and in
    chunks of their own mapping (`mmapped`, returned to the OS when freed)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    info = libc.mallinfo2()
    return {"in_use": info.uordblks, "kept": info.fordblks, "mmapped": info.hblkhd}


def trimmable() -> int:
    """Bytes of RssAnon that glibc's `malloc_trim(0)` (the platform's `release_host_heap`) gives
    back to the OS now."""
    before = status()["RssAnon"]
    release_host_heap()
    return before - status()["RssAnon"]


def status() -> dict[str, int]:
    return process_status(*FIELDS)


class PhaseMeter:
    """Per phase: the peak of each /proc field over its samples, its value at the phase's end, and
    glibc's account then. `mark(name)` ends the current phase and starts `name` (a phase met again,
    in the next micro-batch, goes on accumulating its peak)."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.peaks: dict[str, dict[str, int]] = {}
        self.ends: dict[str, dict] = {}
        self.seconds: dict[str, float] = {}
        self._since = time.perf_counter()
        self._lock = threading.Lock()
        self.running = True
        threading.Thread(target=self._sample, daemon=True).start()

    def _record(self) -> dict[str, int]:
        values = status()
        with self._lock:
            if self.phase is not None:
                peak = self.peaks.setdefault(self.phase, dict(values))
                for key, value in values.items():
                    peak[key] = max(peak[key], value)
        return values

    def _sample(self) -> None:
        while self.running:
            self._record()
            time.sleep(0.002)

    def mark(self, phase: str | None) -> None:
        now = time.perf_counter()
        if self.phase is not None:
            self.ends[self.phase] = {**self._record(), **glibc_account()}
            self.seconds[self.phase] = self.seconds.get(self.phase, 0.0) + now - self._since
        self._since = now
        with self._lock:
            self.phase = phase
        if phase is not None:
            self._record()

    def take(self) -> dict:
        """The phases measured since the last take, and a fresh start."""
        self.mark(None)
        out = {
            p: {"peak": self.peaks[p], "end": self.ends[p], "seconds": self.seconds[p]} for p in self.peaks
        }
        self.peaks, self.ends, self.seconds = {}, {}, {}
        return out


def instrument(meter: PhaseMeter) -> None:
    """Mark the train step's phases: a backward (and the clipping after the last one) and the
    optimizer step; the next micro-batch's forward starts when a backward returns."""
    import torch

    backward, clip = torch.Tensor.backward, torch.nn.utils.clip_grad_norm_

    def marked_backward(self, *args, **kwargs):
        meter.mark("backward")
        backward(self, *args, **kwargs)
        meter.mark("forward")

    def marked_clip(*args, **kwargs):
        meter.mark("backward")
        norm = clip(*args, **kwargs)
        meter.mark("optimizer")
        return norm

    torch.Tensor.backward = marked_backward
    torch.nn.utils.clip_grad_norm_ = marked_clip
