"""Weight-sync bandwidth of each path next to its physical limit, measured in one run on the CPU:

- same-host paths (colocated and the same-host bridge, both through shared memory) against a
  host memory copy of the same tensors (`Tensor.copy_` into preallocated tensors, one process);
  next to it, what two copies of those bytes cost when they run at once in the two processes (the
  trainer's memcpy and the receiver copying its parameters), the floor of a transport that
  copies each byte twice (into the slot, out of it) on two cores that share the memory bus; and
  where a shared-memory sync's time goes: the sender's packing copies, the receiver's copies
  into its parameters (each summed over the sync) and how much of them ran at the same time;
- the cross-host bridge (gloo; on loopback here) against a bare `torch.distributed.broadcast` of
  the same bytes over gloo between the same two processes: each tensor from the trainer's state
  straight into the receiver's parameters, in messages of at most 16 MiB (what weight sync uses),
  all in flight at once;
  the same-kind collective (gloo on the CPU) against that limit too.

Syncs run from this process (the trainer end) to one receiver process that copies every tensor
into its own preallocated parameters, as an engine's loader does; a sync's time runs from `send`
until the receiver has applied the last tensor. Baseline and path alternate round by round, so
both see the same machine load; medians are reported. The state dict is synthetic with the shapes
of Qwen2.5-0.5B (494M parameters, tied embeddings; bfloat16 by default: 0.99 GB); `--layers`
makes it smaller. The tiny model's seconds per sync and, from a short `roll-device run`, its share
of one GRPO step are reported too.

Results replace the weight_sync section of docs/benchmarks.md; the plot is
docs/weight_sync_benchmark.png. The last two lines printed are `shm_vs_memcpy=<ratio>` (the worse
of the two shared-memory paths) and `bridge_vs_raw_gloo=<ratio>`.

    .venv/bin/python benchmarks/weight_sync.py [--layers 24] [--dtype bfloat16] [--rounds 5]

This file measures from the trainer's end; the receiver process is benchmarks/weight_sync_receiver.py,
the section and plot benchmarks/weight_sync_report.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import roll_device as rd
from benchmarks.doc_sections import replace_section
from benchmarks.weight_sync_receiver import (
    Receiver,
    bare_gloo_seconds,
    make_state,
    memcpy_seconds,
    qwen_shapes,
)
from benchmarks.weight_sync_report import PLOT, plot, section
from roll_device.comm import WeightSender, WeightSyncOptions, plan_sync, weights_hash
from roll_device.comm import sender as sender_module
from roll_device.comm.buckets import pack

DOC = ROOT / "docs" / "benchmarks.md"
# (label, plan_sync arguments, the limit it is measured against)
PATHS = [
    ("colocated (shm)", {"colocated": True, "same_node": True, "forced": "colocated"}, "memcpy"),
    ("bridge, same host (shm)", {"colocated": False, "same_node": True, "forced": "bridge"}, "memcpy"),
    ("collective (gloo)", {"colocated": False, "same_node": True, "forced": "collective"}, "gloo"),
    ("bridge, cross-host (gloo)", {"colocated": False, "same_node": False, "forced": "bridge"}, "gloo"),
]


def say(message: str) -> None:
    print(f"[weight-sync-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def tiny_shapes() -> list[tuple[str, tuple[int, ...]]]:
    from transformers import Qwen2ForCausalLM

    from roll_device.models.tiny import build_config

    return [(n, tuple(t.shape)) for n, t in Qwen2ForCausalLM(build_config()).state_dict().items()]


PACKING = [0.0]  # seconds the sender's packing copies took in the current sync


def _timed_pack(entries, parts, buffer):
    start = time.perf_counter()
    try:
        return pack(entries, parts, buffer)
    finally:
        PACKING[0] += time.perf_counter() - start


sender_module.pack = _timed_pack  # the sender's packing copies, timed (the same function)


def two_copies_seconds(receiver: Receiver, state, targets) -> float:
    """Two copies of the same bytes at once: this process's memcpy and the receiver's copy of its
    parameters, started together; the later one's end."""
    receiver.start("copy")
    here = memcpy_seconds(state, targets)
    return max(here, receiver.answer())


class PathUnderTest:
    """One path under test: its sender here and its receiver in the receiver process."""

    def __init__(self, receiver: Receiver, label: str, placement: dict, options: WeightSyncOptions) -> None:
        self.receiver, self.label = receiver, label
        self.plan = plan_sync("cpu", "cpu", **placement)
        self.sender = WeightSender(self.plan, rd.get_platform("cpu"), 1, options)
        receiver.start("connect", label, self.sender.endpoint)
        self.sender.connect()
        receiver.answer()
        self.version = 0

    def sync(self, state: dict[str, torch.Tensor]) -> dict:
        """One sync: its seconds and buckets, the seconds the sender spent packing (`packing`) and
        the receiver copying into its parameters (`copying`)."""
        self.version += 1
        self.receiver.start("receive", self.label)
        PACKING[0] = 0.0
        stats = self.sender.send(state.items(), version=self.version)
        received = self.receiver.answer()
        return {
            "seconds": stats.seconds,
            "buckets": stats.buckets,
            "packing": PACKING[0],
            "copying": received["copying"],
        }

    def close(self) -> None:
        self.receiver.start("close", self.label)
        self.sender.close()
        self.receiver.answer()


def measure(receiver: Receiver, state, targets, options: WeightSyncOptions, rounds: int) -> list[dict]:
    """Every path next to its limit. Each round runs, for every path in turn, its limit and then
    one sync, so that a pair sees the same machine load; a path's ratio is the median of its
    rounds' ratios (a warm-up round first). A shared-memory path is also set against two copies
    run at once (measured right after its memcpy), and its sync's time split into the sender's
    packing and the receiver's copying."""
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    paths = [PathUnderTest(receiver, label, placement, options) for label, placement, _limit in PATHS]
    rows: dict[str, list[dict]] = {label: [] for label, _placement, _limit in PATHS}
    try:
        for round_ in range(rounds + 1):
            for path, (label, _placement, limit) in zip(paths, PATHS):
                row = measure_once(receiver, path, limit, state, targets)
                if round_:
                    rows[label].append(row)
            say(f"round {round_}/{rounds} done" + (" (warm-up)" if not round_ else ""))
        check_exact(receiver, paths, state)
    finally:
        for path in paths:
            path.close()
    return [summarize(path, limit, nbytes, rows[path.label]) for path, (_, _, limit) in zip(paths, PATHS)]


def measure_once(receiver: Receiver, path: PathUnderTest, limit: str, state, targets) -> dict:
    """`path`'s limit (and for a shared-memory path two copies at once), then one sync by it."""
    two_s = None
    if limit == "memcpy":
        limit_s = memcpy_seconds(state, targets)
        two_s = two_copies_seconds(receiver, state, targets)
    else:
        receiver.start("raw")
        limit_s = bare_gloo_seconds(list(state.values()))
        receiver.answer()
    sync = path.sync(state)
    say(
        f"  {path.label}: sync {sync['seconds']:.3f}s (packing {sync['packing']:.3f}s, "
        f"copying {sync['copying']:.3f}s) limit {limit_s:.3f}s"
        + ("" if two_s is None else f", two copies at once {two_s:.3f}s")
    )
    return {**sync, "limit": limit_s, "two": two_s}


def check_exact(receiver: Receiver, paths: list[PathUnderTest], state) -> None:
    """Each path on its own delivers the export exactly: the receiver's weights, zeroed and synced
    by that path alone, hash as the state does."""
    expected = weights_hash(state.items())
    for path in paths:
        receiver.ask("zero")
        path.sync(state)
        if receiver.ask("hash") != expected:
            raise SystemExit(f"{path.label}: the receiver's weights differ from the export")


def summarize(path: PathUnderTest, limit: str, nbytes: int, runs: list[dict]) -> dict:
    """One path's medians over its rounds: GB/s of the path and of its limit and their ratio; for a
    shared-memory path also the split of its time and the two-copies floor."""

    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    path_s, limit_s = median("seconds"), median("limit")
    result = {
        "label": path.label,
        "plan": path.plan.describe(),
        "limit": limit,
        "bytes": nbytes,
        "path_gbps": nbytes / path_s / 1e9,
        "limit_gbps": nbytes / limit_s / 1e9,
        "ratio": statistics.median(r["limit"] / r["seconds"] for r in runs),
        "buckets": runs[-1]["buckets"],
    }
    if limit == "memcpy":
        result.update(
            seconds=path_s,
            memcpy_s=limit_s,
            two_s=median("two"),
            vs_two=statistics.median(r["two"] / r["seconds"] for r in runs),
            packing_s=median("packing"),
            copying_s=median("copying"),
            # the share of the shorter of the two copying phases that ran while the other did
            overlap=statistics.median(
                max(0.0, r["packing"] + r["copying"] - r["seconds"]) / min(r["packing"], r["copying"])
                for r in runs
            ),
        )
    return result


def seconds_per_sync(receiver: Receiver, state, options: WeightSyncOptions, rounds: int) -> dict[str, float]:
    """Median seconds per sync of `state` along each path (after one warm-up sync)."""
    paths = [PathUnderTest(receiver, label, placement, options) for label, placement, _limit in PATHS]
    try:
        seconds = {path.label: [path.sync(state)["seconds"] for _ in range(rounds + 1)][1:] for path in paths}
    finally:
        for path in paths:
            path.close()
    return {label: statistics.median(values) for label, values in seconds.items()}


def pipeline_share(steps: int) -> dict | None:
    """sync_s and step_s of the tiny GRPO run (`roll-device run`, local cluster, defaults)."""
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            sys.executable,
            "-m",
            "roll_device.cli",
            "run",
            f"max_steps={steps}",
            "save_every=0",
            f"hydra.run.dir={run_dir}",
        ]
        say(f"running {' '.join(cmd[2:])} for the share of one RL step")
        proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        metrics = Path(run_dir) / "metrics.jsonl"
        if proc.returncode != 0 or not metrics.exists():
            say(f"the pipeline run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
            return None
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    later = records[1:] or records  # the first step carries start-up effects
    return {
        "steps": len(records),
        "sync_s": statistics.median(r["sync_s"] for r in later),
        "step_s": statistics.median(r["step_s"] for r in later),
        "path": records[-1]["sync_path"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24, help="decoder layers of the 0.5B shapes (24: all)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (2 cores here)")
    parser.add_argument("--pipeline-steps", type=int, default=3)
    parser.add_argument("--skip-pipeline", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    options = WeightSyncOptions(path="auto", bucket_bytes=args.bucket_mb << 20, verify=False, timeout_s=120.0)

    shapes = qwen_shapes(args.layers)
    params = sum(torch.Size(s).numel() for _, s in shapes)
    say(f"state dict: {params / 1e6:.0f}M parameters in {args.dtype}")
    state = make_state(shapes, dtype, fill=True)
    targets = make_state(shapes, dtype, fill=False)
    receiver = Receiver(args.threads)
    try:
        receiver.ask("params", shapes, dtype)
        results = measure(receiver, state, targets, options, args.rounds)
        for r in results:
            say(f"{r['label']}: {r['path_gbps']:.2f} GB/s vs {r['limit_gbps']:.2f} GB/s ({r['ratio']:.2f}x)")
        del state, targets
        tiny_state = make_state(tiny_shapes(), torch.float32, fill=True)
        receiver.ask("params", tiny_shapes(), torch.float32)
        tiny = {
            "bytes": sum(t.numel() * t.element_size() for t in tiny_state.values()),
            "tensors": len(tiny_state),
            "seconds": seconds_per_sync(receiver, tiny_state, options, 10),
        }
    finally:
        receiver.stop()
    share = None if args.skip_pipeline else pipeline_share(args.pipeline_steps)
    ratios = {
        "shm": min(r["ratio"] for r in results if r["limit"] == "memcpy"),
        "bridge": next(r["ratio"] for r in results if r["label"].startswith("bridge, cross-host")),
    }
    report = section(args, params, results, tiny, share, ratios)
    print(report)
    if not args.no_write:
        plot(results, PLOT)
        replace_section(DOC, "weight_sync", report)
        say(f"wrote {DOC.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")
    print(f"shm_vs_memcpy={ratios['shm']:.3f}")
    print(f"bridge_vs_raw_gloo={ratios['bridge']:.3f}")


if __name__ == "__main__":
    main()
