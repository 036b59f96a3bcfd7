"""A worker's step profile on the simulated NPU, in a process of its own (ROLL_DEVICE=npu-sim):
the phases reach the simulation's mstx, and the trace is labelled as simulated."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tests.isolated import simulated_npu


def step_profile(trace_dir: str) -> dict:
    from roll_device.sim.markers import RECORDED
    from roll_device.tracking.phases import WorkerObserver

    platform = simulated_npu()
    observer = WorkerObserver(platform, "actor_train", 0)
    observer.start_profile(3, ["cpu", "device"], Path(trace_dir))
    with observer.phase("update"):
        kept = torch.ones(1024, device=platform.device())  # alive when the phase ends
    path = observer.stop_profile()
    del kept
    trace = json.loads(Path(path).read_text())
    return {
        "path": Path(path).name,
        "label": trace["roll_device"],
        "ranges": [e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"],
        "mstx": [list(r) for r in RECORDED],
        "memory": observer.memory_report(),
        "torch_npu_loaded": "torch_npu" in sys.modules,
    }
