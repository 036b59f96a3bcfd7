"""A worker's phases (docs/observability.md): `@phase("update")` on a worker method runs each call
as the step's phase of that name, a named range of the platform's range API (NVTX, mstx; the
simulation's recorded mstx) and of torch's profiler (so a profile's trace shows it), and reads
the worker's memory after it (roll_device/tracking/memory.py).

The phases: `rollout` (an engine's generation), `logprobs` (a trainer's or reference's forward),
`update` (the policy update), `sync` (sending or receiving weights), `turns` (a colocated role's
offload or reload), `reward` (scoring).

A worker holds one `WorkerObserver` (its `observer`): the largest memory readings of each phase
since its last report, and the step profile under way, if any.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch

from roll_device.platforms import Platform
from roll_device.tracking.memory import Reading, larger, read_memory
from roll_device.tracking.profiler import StepProfile, trace_path

PHASES = ("rollout", "logprobs", "update", "sync", "turns", "reward")
F = TypeVar("F", bound=Callable[..., Any])


class WorkerObserver:
    """One worker's phases, memory readings and step profile."""

    def __init__(self, platform: Platform, role: str, rank: int) -> None:
        self.platform, self.role, self.rank = platform, role, rank
        self.memory: dict[str, Reading] = {}
        self.profile: StepProfile | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """The block as phase `name`: a platform range and a profiler range; memory read after."""
        with self.platform.profiling.range(name), torch.profiler.record_function(name):
            yield
        self.memory[name] = larger(self.memory.get(name), read_memory(self.platform))

    def memory_report(self) -> dict[str, Reading]:
        """Each phase's largest readings since the last report (then forgotten)."""
        report, self.memory = self.memory, {}
        return report

    def start_profile(self, step: int, activities: list[str], trace_dir: Path) -> None:
        """Record this worker until `stop_profile` (a profile under way is stopped first)."""
        self.stop_profile()
        path = trace_path(trace_dir, self.role, self.rank, step, self.platform.simulated)
        label = {"role": self.role, "rank": self.rank, "step": step}
        self.profile = StepProfile(self.platform, activities, path, label)
        self.profile.start()

    def stop_profile(self) -> str | None:
        """Write the profile under way; its trace's path (None when none was)."""
        profile, self.profile = self.profile, None
        return None if profile is None else str(profile.stop())


def phase(name: str) -> Callable[[F], F]:
    """A worker method's calls run as phase `name` of its worker's `observer`."""
    if name not in PHASES:
        raise ValueError(f"phase '{name}' is not one of {', '.join(PHASES)}")

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def run(self, *args: Any, **kwargs: Any) -> Any:
            with self.observer.phase(name):
                return method(self, *args, **kwargs)

        return run  # type: ignore[return-value]

    return wrap
