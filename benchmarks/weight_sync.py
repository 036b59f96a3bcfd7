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
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform as host
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import roll_device as rd
from benchmarks.doc_sections import replace_section
from roll_device.comm import WeightReceiver, WeightSender, WeightSyncOptions, plan_sync, weights_hash
from roll_device.comm import sender as sender_module
from roll_device.comm.buckets import pack, tensor_bytes
from roll_device.comm.groups import MESSAGE_BYTES

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "weight_sync_benchmark.png"
# (label, plan_sync arguments, the limit it is measured against)
PATHS = [
    ("colocated (shm)", {"colocated": True, "same_node": True, "forced": "colocated"}, "memcpy"),
    ("bridge, same host (shm)", {"colocated": False, "same_node": True, "forced": "bridge"}, "memcpy"),
    ("collective (gloo)", {"colocated": False, "same_node": True, "forced": "collective"}, "gloo"),
    ("bridge, cross-host (gloo)", {"colocated": False, "same_node": False, "forced": "bridge"}, "gloo"),
]
RAW_MESSAGE = MESSAGE_BYTES  # the message size weight sync itself uses over gloo
QWEN_05B = {"vocab": 151936, "hidden": 896, "intermediate": 4864, "heads": 14, "kv_heads": 2, "head_dim": 64}


def say(message: str) -> None:
    print(f"[weight-sync-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def qwen_shapes(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """Parameter names and shapes of Qwen2.5-0.5B with `layers` decoder layers (tied embeddings)."""
    q = QWEN_05B
    h, kv = q["hidden"], q["kv_heads"] * q["head_dim"]
    shapes = [("model.embed_tokens.weight", (q["vocab"], h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.q_proj.bias", (h,)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (q["intermediate"], h)),
            (p + "mlp.up_proj.weight", (q["intermediate"], h)),
            (p + "mlp.down_proj.weight", (h, q["intermediate"])),
        ]
    return shapes + [("model.norm.weight", (h,))]


def tiny_shapes() -> list[tuple[str, tuple[int, ...]]]:
    from transformers import Qwen2ForCausalLM

    from roll_device.models.tiny import build_config

    return [(n, tuple(t.shape)) for n, t in Qwen2ForCausalLM(build_config()).state_dict().items()]


def make_state(shapes, dtype: torch.dtype, fill: bool) -> dict[str, torch.Tensor]:
    state = {}
    for name, shape in shapes:
        t = torch.empty(shape, dtype=dtype)
        state[name] = t.uniform_(-0.1, 0.1) if fill else t.zero_()
    return state


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the receiver process ---------------------------------------------------------------------
def receiver_main(conn, threads: int, port: int) -> None:
    """The rollout end: one WeightReceiver per path (by label), all loading into one set of
    preallocated parameters; also the receiving rank of the bare gloo broadcast, and the second
    of two copies run at once."""
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2)
    params: dict[str, torch.Tensor] = {}
    scratch: dict[str, torch.Tensor] = {}
    receivers: dict[str, WeightReceiver] = {}
    copying = [0.0]  # seconds the last sync spent copying into the parameters

    def apply(named):
        copying[0] = 0.0
        for name, tensor in named:
            start = time.perf_counter()
            params[name].copy_(tensor)
            copying[0] += time.perf_counter() - start

    while (request := conn.recv()) is not None:
        command, args = request
        answer = None
        if command == "params":
            params = make_state(*args, fill=False)
            scratch = make_state(*args, fill=False)
        elif command == "connect":
            label, endpoint = args
            receivers[label] = WeightReceiver(endpoint, 1, rd.get_platform("cpu"), timeout_s=120)
            receivers[label].connect()
        elif command == "receive":
            answer = {"seconds": receivers[args[0]].receive(apply).seconds, "copying": copying[0]}
        elif command == "copy":
            answer = memcpy_seconds(params, scratch)
        elif command == "close":
            receivers.pop(args[0]).close()
        elif command == "raw":
            bare_gloo_seconds(list(params.values()))
        elif command == "zero":
            for tensor in params.values():
                tensor.zero_()
        elif command == "hash":
            answer = weights_hash(params.items())
        conn.send(answer)
    dist.destroy_process_group()


def bare_gloo_seconds(tensors: list[torch.Tensor]) -> float:
    """A bare gloo broadcast of the same bytes from rank 0: each tensor straight from the trainer's
    state into the receiver's parameters (no packing, no headers, no copy after), in messages of
    at most `RAW_MESSAGE` bytes, all started at once and then waited for."""
    start = time.perf_counter()
    works = [
        dist.broadcast(data[offset : offset + RAW_MESSAGE], src=0, async_op=True)
        for data in map(tensor_bytes, tensors)
        for offset in range(0, data.numel(), RAW_MESSAGE)
    ]
    for work in works:
        work.wait()
    return time.perf_counter() - start


class Receiver:
    def __init__(self, threads: int) -> None:
        port = free_port()
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=receiver_main, args=(child, threads, port))
        self.process.start()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)

    def ask(self, command: str, *args):
        self.conn.send((command, args))
        return self.conn.recv()

    def start(self, command: str, *args) -> None:
        self.conn.send((command, args))

    def answer(self):
        return self.conn.recv()

    def stop(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=60)
        dist.destroy_process_group()


# ---- measurements -----------------------------------------------------------------------------
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


def memcpy_seconds(state: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]) -> float:
    start = time.perf_counter()
    for name, tensor in state.items():
        targets[name].copy_(tensor)
    return time.perf_counter() - start


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
    rows = {label: [] for label, _placement, _limit in PATHS}
    buckets = {}
    try:
        for round_ in range(rounds + 1):
            for path, (label, _placement, limit) in zip(paths, PATHS):
                two_s = None
                if limit == "memcpy":
                    limit_s = memcpy_seconds(state, targets)
                    two_s = two_copies_seconds(receiver, state, targets)
                else:
                    receiver.start("raw")
                    limit_s = bare_gloo_seconds(list(state.values()))
                    receiver.answer()
                sync = path.sync(state)
                buckets[label] = sync["buckets"]
                if round_:
                    rows[label].append({**sync, "limit": limit_s, "two": two_s})
                    say(
                        f"  {label}: sync {sync['seconds']:.3f}s (packing {sync['packing']:.3f}s, "
                        f"copying {sync['copying']:.3f}s) limit {limit_s:.3f}s"
                        + ("" if two_s is None else f", two copies at once {two_s:.3f}s")
                    )
            say(f"round {round_}/{rounds} done" + (" (warm-up)" if not round_ else ""))
        expected = weights_hash(state.items())
        for path in paths:  # each path on its own delivers the export exactly
            receiver.ask("zero")
            path.sync(state)
            if receiver.ask("hash") != expected:
                raise SystemExit(f"{path.label}: the receiver's weights differ from the export")
    finally:
        for path in paths:
            path.close()
    results = []
    for path, (label, _placement, limit) in zip(paths, PATHS):
        runs = rows[label]

        def median(key: str, runs=runs) -> float:
            return statistics.median(r[key] for r in runs)

        path_s, limit_s = median("seconds"), median("limit")
        result = {
            "label": label,
            "plan": path.plan.describe(),
            "limit": limit,
            "bytes": nbytes,
            "path_gbps": nbytes / path_s / 1e9,
            "limit_gbps": nbytes / limit_s / 1e9,
            "ratio": statistics.median(r["limit"] / r["seconds"] for r in runs),
            "buckets": buckets[label],
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
        results.append(result)
    return results


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


# ---- report -----------------------------------------------------------------------------------
def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(results))
    ax.bar([x - 0.2 for x in xs], [r["path_gbps"] for r in results], width=0.4, label="weight sync")
    ax.bar(
        [x + 0.2 for x in xs],
        [r["limit_gbps"] for r in results],
        width=0.4,
        label="limit (memcpy / bare gloo broadcast)",
    )
    for x, r in zip(xs, results):
        ax.text(x - 0.2, r["path_gbps"], f"{r['ratio']:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [r["label"] for r in results], fontsize=8)
    ax.set_ylabel("GB/s")
    ax.set_title(f"Weight sync, {results[0]['bytes'] / 1e9:.2f} GB state dict, CPU")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def time_split(results: list[dict]) -> list[str]:
    """Where the shared-memory paths' time goes, and the floor two copies at once set."""
    shm = [r for r in results if r["limit"] == "memcpy"]
    lines = [
        (
            "**Where a shared-memory sync's time goes** (medians over the rounds; packing: the sender's "
            "copies into the slots, copying: the receiver's copies out of them into its parameters, each "
            "summed over the sync; overlap: the share of the shorter of the two that ran while the other "
            "did; two copies at once: the trainer's memcpy and the receiver copying its parameters, "
            "started together, measured in the same round):"
        ),
        "",
        "| path | sync s | packing s | copying s | overlap | memcpy s | two copies at once s | vs memcpy | vs two copies at once |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in shm:
        lines.append(
            f"| {r['label']} | {r['seconds']:.3f} | {r['packing_s']:.3f} | {r['copying_s']:.3f} | "
            f"{r['overlap'] * 100:.0f}% | {r['memcpy_s']:.3f} | {r['two_s']:.3f} | {r['ratio']:.2f} | "
            f"{r['vs_two']:.2f} |"
        )
    memcpy_s = statistics.median(r["memcpy_s"] for r in shm)
    two_s = statistics.median(r["two_s"] for r in shm)
    lines += [
        "",
        (
            f"Two copies of the bytes at once, one per core, take {two_s / memcpy_s:.2f}x one memcpy "
            f"({2 * shm[0]['bytes'] / two_s / 1e9:.1f} GB/s copied together against "
            f"{shm[0]['bytes'] / memcpy_s / 1e9:.1f} GB/s by one): they share the memory bus and, with "
            "other work on the machine (the load average above), the cores. A "
            "transport that copies each byte twice (into the slot, out of it into the parameters) "
            f"cannot beat that, so with perfect overlap it reaches about {memcpy_s / two_s:.2f} of "
            "memcpy here; the rest of the gap is the part of the two copies that did not overlap "
            "(the first bucket's packing and the last one's copying run alone; other work on the two "
            "cores). Reaching 0.8 needs one copy per byte: the engine reading the trainer's tensors "
            "in place (parameters living in shared memory), not a better pipeline."
        ),
    ]
    return lines


def section(args, params: int, results, tiny: dict, share: dict | None, ratios: dict) -> str:
    when = datetime.date.today().isoformat()
    lines = [
        "## Weight sync (`benchmarks/weight_sync.py`)",
        "",
        (
            f"Run {when} on `cpu` ({host.machine()}, {os.cpu_count()} CPU cores, load average "
            f"{os.getloadavg()[0]:.1f} at the end; every process uses {args.threads} torch thread(s)); "
            f"a synthetic state dict with the shapes of Qwen2.5-0.5B"
            f"{'' if args.layers == 24 else f' cut to {args.layers} of its 24 layers'}: "
            f"{params / 1e6:.0f}M parameters in {args.dtype} = {results[0]['bytes'] / 1e9:.2f} GB, "
            f"buckets of {args.bucket_mb} MiB; one receiver process that copies each tensor into its "
            f"own parameters; median over {args.rounds} rounds of each path's ratio to its limit, "
            "measured right before it in the same round (for gloo: a bare broadcast of each tensor "
            f"from the trainer's state into the receiver's parameters, in messages of at most "
            f"{RAW_MESSAGE >> 20} MiB like the sync's, all in flight at once). "
            "Gloo runs on loopback here, so the cross-host numbers show the bridge's overhead over "
            "gloo, not a network."
        ),
        "",
        (
            f"**Same-host paths vs memcpy** (goal >= 0.8): **{ratios['shm']:.2f}** (the worse of "
            f"the two). **Cross-host bridge vs bare gloo broadcast** (goal >= 0.9): "
            f"**{ratios['bridge']:.2f}**."
        ),
        "",
        "| path | what moves the bytes | sync GB/s | limit | limit GB/s | ratio |",
        "|---|---|---:|---|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['label']} | {r['plan'].split(' via ')[1]} | {r['path_gbps']:.2f} | "
            f"{'memcpy' if r['limit'] == 'memcpy' else 'bare gloo broadcast'} | {r['limit_gbps']:.2f} | "
            f"{r['ratio']:.2f} |"
        )
    lines += [
        "",
        *time_split(results),
        "",
        f"**Tiny model** ({tiny['bytes'] / 1e6:.2f} MB, {tiny['tensors']} tensors): "
        + ", ".join(f"{label} {seconds * 1e3:.1f} ms" for label, seconds in tiny["seconds"].items())
        + " per sync.",
    ]
    if share is not None:
        lines.append(
            f"In the tiny GRPO run (`roll-device run`, defaults, {share['steps']} steps, median after "
            f"the first; path `{share['path']}`, the vLLM engine as the receiver) a sync took "
            f"{share['sync_s']:.3f} s of a {share['step_s']:.2f} s step: "
            f"**{share['sync_s'] / share['step_s'] * 100:.1f}%** of one RL step. Most of it is the "
            "engine loading the weights (vLLM's reload through its worker) and the Ray calls; the "
            "transfer itself is the few milliseconds above."
        )
    else:
        lines.append("The tiny GRPO run was skipped (`--skip-pipeline`) or failed: no share of an RL step.")
    lines += [
        "",
        (
            "The same-host paths pack each bucket into a shared-memory slot once and the receiver "
            "reads it in place: a sync costs the trainer's copy into the slot and the engine's copy "
            "out of it (two copies where the limit makes one), overlapped on the two cores. The gloo "
            "paths send tensors of 1 MiB or more from the trainer's own memory and pack only the "
            "small ones, so besides the transfer they cost the receiver's copy into its parameters, "
            "overlapped with the next bucket's transfer. Both count on two free cores: other work on "
            "the machine (see the load average) lowers the same-host ratio first. "
            "The simulated NPU is not benchmarked: its numbers would describe the CPU."
        ),
        "",
        f"![weight sync bandwidth]({PLOT.name})",
    ]
    return "\n".join(lines)


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
