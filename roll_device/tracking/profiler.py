"""A worker's profile of one step: the platform's profiler (`platform.profiling.profile`:
torch.profiler with the kind's device activity on CUDA, ROCm and the CPU, torch_npu's on Ascend,
torch's own over the CPU kernels on the simulated NPU) recording from `start` to `stop`, written
as one Chrome trace per worker and step: `<trace_dir>/<role>_<rank>.step<N>.json` (Perfetto,
chrome://tracing). The trace carries who wrote it under `roll_device` (role, rank, step, the
platform); a simulated device's trace says so in that label and in its file name
(`....step<N>.simulated.json`): its device time is CPU time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from roll_device.platforms import Platform

LABEL_KEY = "roll_device"


def trace_path(trace_dir: Path, role: str, rank: int, step: int, simulated: bool) -> Path:
    return trace_dir / f"{role}_{rank}.step{step}{'.simulated' if simulated else ''}.json"


class StepProfile:
    """The platform's profiler, recording this process from `start()` until `stop()`."""

    def __init__(self, platform: Platform, activities: list[str], path: Path, label: dict[str, Any]) -> None:
        self.platform, self.path = platform, path
        self.label = {**label, "platform": platform.name, "simulated": platform.simulated}
        self.profile = platform.profiling.profile(activities=activities)

    def start(self) -> None:
        self.profile.start()

    def stop(self) -> Path:
        """Stop recording and write the trace; returns its path."""
        self.profile.add_metadata_json(LABEL_KEY, json.dumps(self.label))
        self.profile.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.platform.profiling.export_trace(self.profile, str(self.path))
        return self.path
