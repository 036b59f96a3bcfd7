"""The mixture of experts at work, measured in one run on this host:

- the MoE job's step breakdown: `roll-device run experiment=moe` (the tiny Qwen3-MoE: 2 layers, 8
  experts, top-2; FSDP2 and a weight sync each step) for a few steps, the mean seconds of each part
  of a step (rollout, reward, logprobs, train, sync, the colocated turns; the first step, its
  warm-up, left out) from the run's step records: on the CPU (with vLLM, the experiment's engine,
  and with the HF engine) and on the simulated cluster (`cluster=sim`: the trainer and the HF
  engine on the simulated NPU node, a SIMULATION: its kernels are the CPU's; labelled so);
- the weight sync of Qwen3-30B-A3B's shapes (`--layers` of its 48 decoder layers, 128 experts
  each; the embedding and head whole): the FSDP2 trainer (one rank, in this process) exporting
  into the HF engine in this process, as a colocated sync does, in the engine's fp32 and bf16; the
  seconds (median of `--repeats`) and the bytes each sync moves.

Results go to results/moe.json, the moe section of docs/benchmarks.md and docs/moe_benchmark.png.

    .venv/bin/python benchmarks/moe.py [--steps 4] [--parts jobs]   # then
    .venv/bin/python benchmarks/moe.py [--layers 1] [--repeats 3] --parts sync
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform as host
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section
from benchmarks.job_summary import PARTS, step_means, steps

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "moe_benchmark.png"
RESULTS = ROOT / "results" / "moe.json"
# the jobs of the step breakdown: label -> overrides on top of experiment=moe
JOBS = {
    "CPU, vLLM": [],
    "CPU, HF engine": ["rollout=hf"],
    "NPU (simulated), HF engine": [
        "rollout=hf",
        "cluster=sim",
        "roles.actor_train.device=npu",
        "roles.actor_infer.device=npu",
    ],
}
ENGINE_DTYPES = ("float32", "bfloat16")


def say(message: str) -> None:
    print(f"[moe {time.strftime('%H:%M:%S')}] {message}", flush=True)


def job(overrides: list[str], steps_run: int, run_dir: Path) -> dict:
    """The mean seconds of each part of a step of `experiment=moe` with `overrides`."""
    from benchmarks.configs import run_config
    from roll_device.commands.run import run_checked

    config = run_config("experiment=moe", f"max_steps={steps_run}", "save_every=0", *overrides)
    run_checked(config, run_dir)
    records = steps(run_dir)
    samples = config.data.prompts_per_step * config.algorithm.samples_per_prompt
    return {**step_means(records, samples), "steps": len(records), "overrides": overrides}


def job_alone(overrides: list[str], steps_run: int, run_dir: Path) -> dict:
    """`job` in a fresh process: a run's Ray cluster is process-wide (the simulated cluster started
    after a local one in the same process lost its trainer's worker)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(job, overrides, steps_run, run_dir).result()


def jobs(steps_run: int) -> dict:
    """The step breakdown of each of JOBS."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="roll-device-moe-jobs-") as directory:
        for index, (label, overrides) in enumerate(JOBS.items()):
            say(f"job: {label}")
            out[label] = job_alone(overrides, steps_run, Path(directory) / str(index))
    return out


def sync_once(trainer, engine, dtype) -> tuple[float, int]:
    """Seconds and bytes of one export from `trainer` into `engine` in `dtype`."""
    moved = 0

    def counted():
        nonlocal moved
        for name, tensor in trainer.export_weights(dtype=dtype, snapshot=False):
            moved += tensor.numel() * tensor.element_size()
            yield name, tensor

    start = time.perf_counter()
    engine.update_weights(counted())
    return time.perf_counter() - start, moved


def sync_into(trainer, model_path: str, dtype_name: str, repeats: int) -> dict:
    """The syncs of `trainer`'s weights into an HF engine in `dtype_name`, the first one (warm-up)
    left out."""
    import torch

    import roll_device as rd
    from benchmarks.configs import changed, run_config
    from strategies.inference.hf import HfStrategy

    engine = HfStrategy(rd.get_platform("cpu"))
    engine.initialize(model_path, changed(run_config("rollout=hf").rollout, "rollout", dtype=dtype_name))
    dtype = getattr(torch, dtype_name)
    runs = [sync_once(trainer, engine, dtype) for _ in range(repeats + 1)][1:]
    engine.shutdown()
    return {"seconds": [s for s, _ in runs], "bytes": runs[0][1]}


def syncs(layers: int, repeats: int) -> dict:
    """The 30B-A3B-shaped model's syncs per engine dtype, and its parameter count."""
    import roll_device as rd
    from benchmarks.configs import trainer_settings
    from roll_device.models.qwen_shaped import make_qwen_shaped_model
    from strategies.training.fsdp import FsdpTrainStrategy

    with tempfile.TemporaryDirectory(prefix="roll-device-moe-") as directory:
        say(f"making Qwen3-30B-A3B's shapes with {layers} layers")
        model = str(make_qwen_shaped_model(Path(directory) / "m", layers, shapes="qwen3-30b-a3b"))
        trainer = FsdpTrainStrategy(rd.get_platform("cpu"))
        trainer.initialize(model, trainer_settings("fsdp", mixed_precision="fp32"))
        parameters = sum(p.numel() for p in trainer.model.parameters())
        out = {}
        for dtype in ENGINE_DTYPES:
            say(f"sync into the HF engine in {dtype}")
            out[dtype] = sync_into(trainer, model, dtype, repeats)
        trainer.shutdown()
    return {"layers": layers, "parameters": parameters, "paths": out}


def job_table(jobs: dict) -> str:
    names = [part.removesuffix("_s") for part in PARTS]
    rows = [f"| job | {' | '.join(names)} | tokens/s |", "|---" * (len(PARTS) + 2) + "|"]
    for label, r in jobs.items():
        cells = " | ".join(f"{r[part]:.2f}" for part in PARTS)
        rows.append(f"| {label} | {cells} | {r['tokens_per_s']:.0f} |")
    return "\n".join(rows)


def sync_table(sync: dict) -> str:
    rows = ["| path | bytes per sync | seconds (median) | GB/s |", "|---|---|---|---|"]
    for dtype, r in sync["paths"].items():
        seconds = statistics.median(r["seconds"])
        rows.append(
            f"| FSDP2 (1 rank) -> HF engine in-process, engine {dtype} | {r['bytes'] / 2**30:.2f} GiB | "
            f"{seconds:.2f} | {r['bytes'] / seconds / 1e9:.2f} |"
        )
    return "\n".join(rows)


def report(results: dict) -> None:
    sections = [
        "## Mixture of experts: the MoE job's steps and the 30B-A3B-shaped sync (benchmarks/moe.py)",
        "",
    ]
    sections.append(
        f"Host: {host.node()}, {os.cpu_count()} cores, measured {results['stamp']}; load average "
        f"{results['load'][0]:.1f} at the start and {results['load'][1]:.1f} at the end (the host is "
        "shared with other work: seconds spread with it)."
    )
    if "jobs" in results:
        sections += [
            "",
            (
                f"`roll-device run experiment=moe max_steps={results['steps']}` (the tiny Qwen3-MoE: 2 layers, 8 "
                "experts, top-2, fp32; FSDP2 on one rank; a weight sync each step): mean seconds of each part of a "
                "step over the steps after the first (`swap`: the colocated turns; `step`: the whole step, "
                "parts overlap or wait in it). The simulated NPU row is a SIMULATION (`cluster=sim`: the trainer "
                "and the HF engine on the simulated NPU node, whose kernels are the CPU's; a Ray cluster of "
                "three nodes on this host): it shows the job runs there, not an NPU's speed."
            ),
            "",
            job_table(results["jobs"]),
        ]
    if "sync" in results:
        sync = results["sync"]
        sections += [
            "",
            (
                f"The weight sync of Qwen3-30B-A3B's shapes with {sync['layers']} of its 48 decoder layers (128 "
                f"experts, 8 routed per token; the embedding and the untied head whole: "
                f"{sync['parameters'] / 1e9:.2f}B parameters; all 48 layers, 30.5B parameters, do not fit "
                "this 23 GB host): the FSDP2 trainer (one rank, fp32) exporting into the HF engine in the same "
                "process, as the colocated sync does, each tensor cast to the engine's dtype on the way; the "
                f"median of {results['repeats']} syncs after a first. Every expert's weights move: one rank "
                "holds them all."
            ),
            "",
            sync_table(sync),
        ]
    sections += ["", "![mixture of experts](moe_benchmark.png)"]
    replace_section(DOC, "moe", "\n".join(sections))


def plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [key for key in ("jobs", "sync") if key in results]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    for ax, key in zip(axes[0], panels, strict=True):
        (plot_jobs if key == "jobs" else plot_sync)(ax, results[key])
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def plot_jobs(ax, jobs: dict) -> None:
    labels = list(jobs)
    bottom = [0.0] * len(labels)
    for part in PARTS[:-1]:  # stacked parts; the whole step is its own marker
        heights = [jobs[label][part] for label in labels]
        ax.bar(labels, heights, bottom=bottom, label=part.removesuffix("_s"))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.scatter(
        labels, [jobs[label]["step_s"] for label in labels], color="black", marker="_", s=400, label="step"
    )
    ax.set_ylabel("seconds per step")
    ax.set_title("experiment=moe, tiny Qwen3-MoE")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7)


def plot_sync(ax, sync: dict) -> None:
    labels = [f"engine {dtype}\n{r['bytes'] / 2**30:.2f} GiB" for dtype, r in sync["paths"].items()]
    seconds = [statistics.median(r["seconds"]) for r in sync["paths"].values()]
    ax.bar(labels, seconds)
    ax.set_ylabel("seconds per sync")
    ax.set_title(f"Qwen3-30B-A3B shapes, {sync['layers']} layer(s): FSDP2 -> HF engine")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", nargs="+", choices=("jobs", "sync"), default=["jobs", "sync"])
    args = parser.parse_args()
    # each part may run alone (`--parts`), in a process of its own: the sync's 30B-shaped model
    # leaves this process's memory large for the simulated cluster's workers beside it
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results.update({"stamp": stamp, "steps": args.steps, "repeats": args.repeats})
    load = os.getloadavg()[0]
    if "jobs" in args.parts:
        results["jobs"] = jobs(args.steps)
    if "sync" in args.parts:
        results["sync"] = syncs(args.layers, args.repeats)
    results["load"] = (load, os.getloadavg()[0])
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    report(results)
    plot(results)


if __name__ == "__main__":
    main()
