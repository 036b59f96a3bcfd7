"""Weight sync by Ray Direct Transport (`weight_sync.path=rdt`) against the collective path, the same
state dict between the same two simulated-NPU Ray actors, in one run.

Each round syncs the state once along each path (alternating, so that both see the same machine
load); the time is the receiver's (`SyncStats.seconds`: from asking for the first bucket to the
last one applied); medians are reported. The NPU is SIMULATED (hccl is gloo on host memory over
loopback): the ratio says what Ray's coordination costs against a plain broadcast on this machine,
not what an NPU link moves. It is the measurement the planner's `auto` would need before it chose
`rdt` (it does not).

Results replace the rdt_weight_sync section of docs/benchmarks.md. The last line printed is
`collective_vs_rdt=<ratio>` (the collective path's time over rdt's: above 1, rdt is faster).

    .venv/bin/python benchmarks/rdt_weight_sync.py [--rounds 5] [--state-mb 64] [--bucket-mb 16]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform as host
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLOT = ROOT / "docs" / "rdt_weight_sync_benchmark.png"
sys.path.insert(0, str(ROOT))

import ray
import torch

import roll_device as rd
from benchmarks.doc_sections import replace_section
from roll_device.comm import WeightReceiver, WeightSender, plan_sync
from roll_device.comm.rdt_transport import RDT_ACTOR_OPTIONS
from roll_device.commands.gate import load_config

DOC = ROOT / "docs" / "benchmarks.md"
SIM_NPU = {"resources": {"NPU": 1}, "num_cpus": 0, "runtime_env": {"env_vars": {"ROLL_DEVICE": "npu-sim"}}}
PATHS = ("collective", "rdt")
TENSOR_BYTES = 4 << 20


class SyncEnd:
    """One end of a weight sync on this actor's (simulated NPU) platform."""

    def __init__(self) -> None:
        self.platform = rd.current_platform()
        self.end = None

    def open_sender(self, path: str, state_bytes: int, bucket_bytes: int):
        plan = plan_sync("npu-sim", "npu-sim", colocated=False, same_node=True, forced=path)
        numel = TENSOR_BYTES // 4
        self.state = {
            f"w{i}": torch.randn(numel).to(self.platform.device()) for i in range(state_bytes // TENSOR_BYTES)
        }
        options = load_config([f"weight_sync.bucket_bytes={bucket_bytes}"]).weight_sync
        self.end = WeightSender(plan, self.platform, 1, options)
        return self.end.endpoint

    def open_receiver(self, endpoint) -> None:
        self.end = WeightReceiver(endpoint, 1, self.platform)

    def connect(self) -> None:
        self.end.connect()

    def send(self, version: int) -> float:
        return self.end.send(self.state.items(), version=version).seconds

    def receive(self) -> float:
        return self.end.receive(lambda named: [t.clone() for _, t in named]).seconds

    def close(self) -> None:
        self.end.close()


def _sync_seconds(
    sender, receiver, path: str, state_bytes: int, bucket_bytes: int, syncs: int
) -> list[float]:
    endpoint = ray.get(sender.open_sender.remote(path, state_bytes, bucket_bytes))
    ray.get(receiver.open_receiver.remote(endpoint))
    ray.get([sender.connect.remote(), receiver.connect.remote()])
    try:
        return [ray.get([sender.send.remote(v), receiver.receive.remote()])[1] for v in range(1, syncs + 1)]
    finally:
        ray.get([sender.close.remote(), receiver.close.remote()])


def run(rounds: int, state_bytes: int, bucket_bytes: int) -> dict:
    actor_class = ray.remote(**RDT_ACTOR_OPTIONS)(SyncEnd)
    sender, receiver = [actor_class.options(**SIM_NPU).remote() for _ in range(2)]
    seconds = {path: [] for path in PATHS}
    _sync_seconds(sender, receiver, "rdt", state_bytes, bucket_bytes, 1)  # warm-up: imports, first group
    for _ in range(rounds):
        for path in PATHS:
            seconds[path] += _sync_seconds(sender, receiver, path, state_bytes, bucket_bytes, 2)
    medians = {path: statistics.median(values) for path, values in seconds.items()}
    return {
        "state_bytes": state_bytes,
        "bucket_bytes": bucket_bytes,
        "syncs": len(seconds["rdt"]),
        "seconds": medians,
        "each": seconds,
        "collective_vs_rdt": medians["collective"] / medians["rdt"],
    }


def plot(result: dict, path: Path) -> None:
    """Every sync's time per path (points) and its median (bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    for i, name in enumerate(PATHS):
        ax.bar(i, result["seconds"][name], color="lightgray", edgecolor="gray")
        each = result["each"][name]
        ax.scatter([i] * len(each), each, s=12, zorder=3)
    ax.set_xticks(range(len(PATHS)), [f"`{name}`" for name in PATHS])
    ax.set_ylabel("seconds per sync (receiver)")
    ax.set_title(f"{result['state_bytes'] >> 20} MiB weight sync, simulated NPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(result: dict) -> str:
    mib = result["state_bytes"] >> 20
    rate = {path: result["state_bytes"] / s / 1e9 for path, s in result["seconds"].items()}
    load = os.getloadavg()[0]
    return "\n".join(
        [
            "## Weight sync by Ray Direct Transport (`benchmarks/rdt_weight_sync.py`) - SIMULATED NPU",
            "",
            (
                f"Run {datetime.date.today()} on `{host.machine()}` ({os.cpu_count()} CPU cores, load average "
                f"{load:.1f} at the end, shared with other work: expect noise); one local Ray instance; two "
                f"simulated-NPU actors (hccl is gloo on host memory over loopback). A {mib} MiB state "
                f"({TENSOR_BYTES >> 20} MiB tensors, {result['bucket_bytes'] >> 20} MiB buckets) synced "
                f"{result['syncs']} times along each path, alternating; the receiver's time, median:"
            ),
            "",
            "![rdt weight sync](rdt_weight_sync_benchmark.png)",
            "",
            "| path | seconds per sync | GB/s |",
            "|---|---:|---:|",
            *(f"| `{path}` | {result['seconds'][path]:.3f} | {rate[path]:.2f} |" for path in PATHS),
            "",
            (
                f"The collective path's time over rdt's: **{result['collective_vs_rdt']:.2f}** (above 1: rdt "
                "is faster). The planner's `auto` does not choose `rdt`; it would only where this ratio, "
                "measured on the real link, is above 1."
            ),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--state-mb", type=int, default=64)
    parser.add_argument("--bucket-mb", type=int, default=16)
    parser.add_argument("--no-write", action="store_true", help="print, do not touch docs/")
    args = parser.parse_args()
    ray.init(address="local", num_cpus=2, resources={"NPU": 2}, include_dashboard=False, log_to_driver=False)
    try:
        result = run(args.rounds, args.state_mb << 20, args.bucket_mb << 20)
    finally:
        ray.shutdown()
    body = section(result)
    print(body)
    if not args.no_write:
        replace_section(DOC, "rdt_weight_sync", body)
        plot(result, PLOT)
    print(f"collective_vs_rdt={result['collective_vs_rdt']:.2f}")


if __name__ == "__main__":
    main()
