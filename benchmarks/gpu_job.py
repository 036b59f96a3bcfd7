"""The whole job on a GPU (`scripts/gpu-job.sh`) as a section of docs/benchmarks.md.

Per job: the mean seconds of each part of a step (benchmarks/job_summary.py: warm-up step and a step
whose sync was cut short left out), rollout tokens per second, the device memory the colocated
turns freed, and the GPU's peak used memory in each phase of a step. The peaks join the readings of
scripts/gpu_memory_log.py (every process on the GPU, one reading about every 0.1 s) with the
phases' spans in the steps' timelines: the highest reading inside any span of that phase, over all
steps. A phase shorter than the reading interval can hold no reading: its peak shows as "-".
Beside them, the weight-sync benchmark's lines on the GPU (benchmarks/sync_end_to_end.py
--device cuda), where a results folder holds them.

    python benchmarks/gpu_job.py RESULTS_DIR [RESULTS_DIR ...] [--no-write]

A RESULTS_DIR is one gpu-job.sh folder: device.txt, memory.csv, and a folder per job with its
metrics.jsonl and config.yaml; sync_e2e.txt where the call ran the sync benchmark. Prints one line
per job; writes the `gpu_job` section and docs/gpu_job_benchmark.png unless --no-write.
"""

from __future__ import annotations

import argparse
import sys
from bisect import bisect_left, bisect_right
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section
from benchmarks.job_summary import step_means, steps, timed

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "gpu_job_benchmark.png"
# a step's phases in the order they run; `for_*` are the colocated turns (offload and reload)
PHASES = ("for_rollout", "rollout", "for_training", "reward", "logprob", "update", "for_sync", "sync")
# the parts of a step's time, as job_summary means them, with the names the tables use
PARTS = {
    "rollout_s": "rollout",
    "reward_s": "reward",
    "logprob_s": "logprob",
    "train_s": "update",
    "sync_s": "sync",
    "swap_s": "turns",
}
GIB = 2**30


def read_memory(path: Path) -> tuple[list[float], list[float]]:
    """memory.csv's readings: (epoch seconds, used MiB), in time order."""
    rows = [line.split(",") for line in path.read_text().splitlines()[1:] if line.strip()]
    rows.sort(key=lambda row: float(row[0]))
    return [float(t) for t, _ in rows], [float(mib) for _, mib in rows]


def phase_peaks(records: list[dict], times: list[float], used_mib: list[float]) -> dict[str, float | None]:
    """Per phase, the highest reading (MiB) inside any of its spans in `records`' timelines;
    None where no reading falls inside one (a phase shorter than the reading interval, or absent)."""
    peaks: dict[str, float | None] = dict.fromkeys(PHASES)
    for record in records:
        for phase in PHASES:
            span = record["timeline"].get(phase)
            if span is None:
                continue
            inside = used_mib[bisect_left(times, span[0]) : bisect_right(times, span[1])]
            if inside:
                peaks[phase] = max(max(inside), peaks[phase] or 0.0)
    return peaks


def samples_per_step(run_dir: Path) -> int:
    import yaml

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    return config["algorithm"]["samples_per_prompt"] * config["data"]["prompts_per_step"]


def load_job(run_dir: Path, memory: tuple[list[float], list[float]]) -> dict:
    records = steps(run_dir)
    if not records:
        raise SystemExit(f"gpu_job: {run_dir} holds no finished step (metrics.jsonl)")
    last = timed(records)[-1]
    return {
        "name": run_dir.name,
        "steps": len(records),
        "reward": (records[0]["reward_mean"], records[-1]["reward_mean"]),
        "means": step_means(records, samples_per_step(run_dir)),
        "freed_gib": {
            key.removeprefix("freed_bytes_"): value / GIB
            for key, value in last.items()
            if key.startswith("freed_bytes_")
        },
        "peaks_gib": {
            phase: None if mib is None else mib / 1024 for phase, mib in phase_peaks(records, *memory).items()
        },
        "turns_timed": any("swap_s" in r for r in records),
    }


def load_results(folder: Path) -> dict:
    """One gpu-job.sh folder: its device line, its jobs (in the order they ran), its sync lines."""
    memory = read_memory(folder / "memory.csv")
    names = [
        line.split()[0] for line in (folder / "phases.txt").read_text().splitlines() if " start " in line
    ]
    jobs = [load_job(folder / name, memory) for name in names if (folder / name / "metrics.jsonl").exists()]
    sync = folder / "sync_e2e.txt"
    return {
        "folder": folder.name,
        "device": (folder / "device.txt").read_text().strip(),
        "jobs": jobs,
        "sync": [parse_sync_line(line) for line in sync.read_text().splitlines()] if sync.exists() else [],
    }


def parse_sync_line(line: str) -> dict[str, str]:
    """`sync_e2e key=value ...` (benchmarks/sync_end_to_end.py's line) as a dict."""
    return dict(item.split("=", 1) for item in line.split()[1:])


def job_line(job: dict) -> str:
    means, peaks = job["means"], job["peaks_gib"]
    parts = " ".join(f"{name}={means[part]:.3f}s" for part, name in PARTS.items())
    peak = " ".join(f"{phase}={'-' if gib is None else f'{gib:.1f}'}" for phase, gib in peaks.items())
    return (
        f"gpu_job {job['name']}: {job['steps']} steps, reward {job['reward'][0]:.3f} -> {job['reward'][1]:.3f}; "
        f"per step {parts} step={means['step_s']:.3f}s; {means['tokens_per_s']:.0f} tokens/s; "
        f"peak GiB {peak}"
    )


def cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def section(results: list[dict]) -> str:
    jobs = [job for result in results for job in result["jobs"]]
    lines = [
        "## The whole job on a GPU (`scripts/gpu-job.sh`, `benchmarks/gpu_job.py`)",
        "",
        setting(results),
        "",
        *times_table(jobs),
        "",
        (
            "Peak used GPU memory per phase (GiB; every process on the GPU, readings about every 0.1 s; "
            '"-": no reading fell inside the phase, shorter than the interval):'
        ),
        "",
        "| job | " + " | ".join(PHASES) + " |",
        "|---|" + "---:|" * len(PHASES),
        *(
            f"| {job['name']} | " + " | ".join(cell(job["peaks_gib"][p], 1) for p in PHASES) + " |"
            for job in jobs
        ),
        *sync_table([row for result in results for row in result["sync"]]),
        "",
        f"![GPU job breakdown]({PLOT.name})",
    ]
    return "\n".join(lines)


def setting(results: list[dict]) -> str:
    """Which jobs ran in which folder, on what, and how the job is laid out on the one GPU."""
    devices = {r["device"] for r in results}
    calls = "; ".join(f"{r['folder']}: {', '.join(j['name'] for j in r['jobs'])}" for r in results)
    where = f"on {devices.pop()}" if len(devices) == 1 else "each on the device its folder names"
    return (
        f"Runs {calls}; {where}. Nothing simulated: `roll-device run` with the project's embedded Ray (a "
        "local cluster), trainer (FSDP2 over NCCL, one rank; or Megatron-core), reference hosted in the "
        "trainer's workers and rollout (`rollout=hf`, decode graphs on) colocated on the one GPU with "
        "fractional shares, weights synced by the colocated path (CUDA IPC), the trainer offloaded "
        "while the engine generates and the engine asleep while the trainer steps. Mean seconds per "
        "step over the steps after the first (a step whose sync the run's time bound cut short is left "
        "out); turns: the colocated offload and reload (`swap_s`), timed from the 0.5B-shaped run on; "
        "step: the whole step, turns included where timed."
    )


def times_table(jobs: list[dict]) -> list[str]:
    """Per job: steps, reward, the mean seconds of each part, tokens/s and what the turns freed."""
    lines = [
        (
            "| job | steps | reward first -> last | rollout s | reward s | logprob s | update s | sync s | turns s "
            "| step s | rollout tok/s | freed by the turns GiB |"
        ),
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for job in jobs:
        m = job["means"]
        turns = cell(m["swap_s"], 3) if job["turns_timed"] else "not timed"
        freed = ", ".join(f"{role} {gib:.2f}" for role, gib in job["freed_gib"].items())
        lines.append(
            f"| {job['name']} | {job['steps']} | {job['reward'][0]:.3f} -> {job['reward'][1]:.3f} | "
            + " | ".join(f"{m[p]:.3f}" for p in ("rollout_s", "reward_s", "logprob_s", "train_s", "sync_s"))
            + f" | {turns} | {m['step_s']:.3f} | {m['tokens_per_s']:,.0f} | {freed} |"
        )
    return lines


def sync_table(rows: list[dict]) -> list[str]:
    """The sync benchmark's lines on the GPU, where the folders hold them."""
    if not rows:
        return []
    lines = [
        "",
        (
            "Weight sync end to end on the GPU (`benchmarks/sync_end_to_end.py --device cuda`: from the "
            "trainer's live parameters to the engine's, fp32, two processes on the one GPU, the paths one GPU "
            "can take; median of the benchmark's rounds; peak extra: the device allocator's peak above what "
            "each process held before the sync):"
        ),
        "",
        (
            "| size | trainer -> engine | path | s | GB/s | vs one device memcpy | copies | "
            "peak extra MB (trainer + engine) |"
        ),
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['size']} | {row['trainer']} -> {row['engine']} | {row['path']} | {row['seconds']} | "
            f"{row['gbps']} | {row['vs_memcpy']} | {row['copies']} | {row['peak_extra_mb']} |"
        )
    return lines


def plot(jobs: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (times, memory) = plt.subplots(1, 2, figsize=(12, 4.2))
    names = [job["name"] for job in jobs]
    left = [0.0] * len(jobs)
    for part, label in PARTS.items():
        widths = [job["means"][part] for job in jobs]
        times.barh(names, widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths)]
    rest = [max(job["means"]["step_s"] - done, 0.0) for job, done in zip(jobs, left)]
    times.barh(names, rest, left=left, label="other", color="lightgrey")
    times.set_xlabel("seconds per step (mean)")
    times.set_title("Where a step's time goes")
    times.legend(fontsize=7)
    width = 0.8 / len(jobs)
    for i, job in enumerate(jobs):
        xs = [p + i * width for p in range(len(PHASES))]
        memory.bar(xs, [job["peaks_gib"][p] or 0.0 for p in PHASES], width=width, label=job["name"])
    memory.set_xticks([p + 0.4 - width / 2 for p in range(len(PHASES))], PHASES, rotation=30, fontsize=7)
    memory.set_ylabel("GiB")
    memory.set_title("Peak used GPU memory per phase")
    memory.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="gpu-job.sh result folders")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    results = [load_results(Path(folder)) for folder in args.results]
    for result in results:
        for job in result["jobs"]:
            print(job_line(job))
    if not args.no_write:
        replace_section(DOC, "gpu_job", section(results))
        plot([job for result in results for job in result["jobs"]])
        print(f"wrote {DOC.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
