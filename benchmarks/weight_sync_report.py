"""The weight_sync section of docs/benchmarks.md and its plot (docs/weight_sync_benchmark.png), from
what benchmarks/weight_sync.py measured: each path next to its limit, where a shared-memory sync's
time goes, the tiny model's seconds per sync and its share of an RL step."""

from __future__ import annotations

import datetime
import os
import platform as host
import statistics
from pathlib import Path

from benchmarks.weight_sync_receiver import RAW_MESSAGE

PLOT = Path(__file__).resolve().parent.parent / "docs" / "weight_sync_benchmark.png"


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
    lines = [
        "## Weight sync (`benchmarks/weight_sync.py`)",
        "",
        setting(args, params, results[0]["bytes"]),
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
        step_share(share),
        "",
        READING,
        "",
        f"![weight sync bandwidth]({PLOT.name})",
    ]
    return "\n".join(lines)


def setting(args, params: int, nbytes: int) -> str:
    """Where, when and on what the paths were measured."""
    return (
        f"Run {datetime.date.today().isoformat()} on `cpu` ({host.machine()}, {os.cpu_count()} CPU cores, "
        f"load average {os.getloadavg()[0]:.1f} at the end; every process uses {args.threads} torch "
        f"thread(s)); a synthetic state dict with the shapes of Qwen2.5-0.5B"
        f"{'' if args.layers == 24 else f' cut to {args.layers} of its 24 layers'}: "
        f"{params / 1e6:.0f}M parameters in {args.dtype} = {nbytes / 1e9:.2f} GB, "
        f"buckets of {args.bucket_mb} MiB; one receiver process that copies each tensor into its "
        f"own parameters; median over {args.rounds} rounds of each path's ratio to its limit, "
        "measured right before it in the same round (for gloo: a bare broadcast of each tensor "
        f"from the trainer's state into the receiver's parameters, in messages of at most "
        f"{RAW_MESSAGE >> 20} MiB like the sync's, all in flight at once). "
        "Gloo runs on loopback here, so the cross-host numbers show the bridge's overhead over "
        "gloo, not a network."
    )


def step_share(share: dict | None) -> str:
    """The sync's share of a step of the tiny GRPO run, where it ran."""
    if share is None:
        return "The tiny GRPO run was skipped (`--skip-pipeline`) or failed: no share of an RL step."
    return (
        f"In the tiny GRPO run (`roll-device run`, defaults, {share['steps']} steps, median after "
        f"the first; path `{share['path']}`, the vLLM engine as the receiver) a sync took "
        f"{share['sync_s']:.3f} s of a {share['step_s']:.2f} s step: "
        f"**{share['sync_s'] / share['step_s'] * 100:.1f}%** of one RL step. Most of it is the "
        "engine loading the weights (vLLM's reload through its worker) and the Ray calls; the "
        "transfer itself is the few milliseconds above."
    )


READING = (
    "The same-host paths pack each bucket into a shared-memory slot once and the receiver "
    "reads it in place: a sync costs the trainer's copy into the slot and the engine's copy "
    "out of it (two copies where the limit makes one), overlapped on the two cores. The gloo "
    "paths send tensors of 1 MiB or more from the trainer's own memory and pack only the "
    "small ones, so besides the transfer they cost the receiver's copy into its parameters, "
    "overlapped with the next bucket's transfer. Both count on two free cores: other work on "
    "the machine (see the load average) lowers the same-host ratio first. "
    "The simulated NPU is not benchmarked: its numbers would describe the CPU."
)
