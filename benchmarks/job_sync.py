"""The job's weight sync against the benchmark's same path at the same size, in one run (issue 48).

Per trainer rank count N of `--ranks` (1 and 2 by default):
1. The job: `roll-device run experiment=qwen05b_shapes roles.actor_train.num_devices=N` (the FSDP2
   trainer and the HF engine, fp32, local Ray, all on this host) on Qwen2.5-0.5B's shapes with
   `--layers` decoder layers (the whole vocabulary; fewer layers than 24 because two fp32 copies of
   the whole model, the trainer's Adam state and the engine beside it do not fit this shared 23 GB
   host), `--steps` steps. Its step records split each sync (`sync_export_s`, `sync_cast_s`,
   `sync_transfer_s`, `sync_load_s`, `sync_calls_s`: roll_device/pipeline/sync_split.py); the
   steps after the first are kept.
2. The benchmark's same path on the same model, `--rounds` syncs after a warm-up:
   - one rank: benchmarks/sync_end_to_end.py's trainer and engine processes (the same strategies,
     connected as a run connects them) on the path the job took (its `sync_path` on one host:
     `bridge-shm`), its trainer's sender set up as a run's and as sync_end_to_end.py runs it;
   - N ranks: benchmarks/sync_sharded.py's world of N FSDP2 ranks and one engine on their node
     (each rank's own slices over a shared-memory link of its own, one copy), as the job's ranks
     send.

Goal: the job's median sync (`sync_s`, the Ray calls around it included) within 1.5x of the
benchmark's, at each N. Results go to results/job_sync.json, the job_sync section of
docs/benchmarks.md and docs/job_sync_benchmark.png.

    .venv/bin/python benchmarks/job_sync.py [--layers 4] [--steps 4] [--rounds 3] [--ranks 1 2]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section, save_results
from benchmarks.job_summary import steps, timed

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "job_sync_benchmark.png"
RESULTS = ROOT / "results" / "job_sync.json"
GOAL = 1.5
PARTS = ("sync_export_s", "sync_cast_s", "sync_transfer_s", "sync_load_s", "sync_calls_s")
LABELS = {
    "bridge": "bridge-shm",
    "colocated": "colocated",
    "collective": "collective",
}  # the job's path, one host


def say(message: str) -> None:
    print(f"[job_sync {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---- the job ------------------------------------------------------------------------------------
def job(model: str, ranks: int, steps_run: int, run_dir: str) -> list[dict]:
    """The step records of `experiment=qwen05b_shapes` on `model`, `ranks` trainer ranks."""
    from benchmarks.configs import run_config
    from roll_device.commands.run import run_checked

    overrides = [
        "experiment=qwen05b_shapes",
        f"model.path={model}",
        f"roles.actor_train.num_devices={ranks}",
        f"max_steps={steps_run}",
        "save_every=0",
    ]
    run_checked(run_config(*overrides), Path(run_dir))
    return steps(run_dir)


def job_alone(model: str, ranks: int, steps_run: int, run_dir: str) -> list[dict]:
    """`job` in a fresh process: the run's Ray cluster and its memory go with it."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(job, model, ranks, steps_run, run_dir).result()


def job_split(records: list[dict]) -> dict:
    """Median seconds of the job's sync and of each part, over the timed steps."""
    kept = [r for r in timed(records) if r.get("sync_s") is not None]
    split = {part: statistics.median(r[part] for r in kept) for part in ("sync_s", *PARTS)}
    return {**split, "steps": len(kept), "path": kept[0]["sync_path"], "bytes": kept[0]["sync_bytes"]}


# ---- the benchmark's same path -------------------------------------------------------------------
def bench(model: str, label: str, rounds: int, as_run: bool) -> dict:
    """sync_end_to_end.py's row for `label` (fsdp -> hf) on `model`; `as_run`: its trainer's sender
    set up as a run's (the one-copy path on shared memory), else as sync_end_to_end.py runs it."""
    from benchmarks.sync_e2e_processes import Process, engine_main, trainer_main
    from benchmarks.sync_end_to_end import engine_sync_path, measure_group

    trainer = Process(trainer_main, "fsdp", model, "cpu", as_run)
    try:
        engine = Process(engine_main, "hf", model, engine_sync_path([label]), "cpu")
        try:
            (row,) = measure_group(trainer, engine, trainer.ready, ("fsdp", "hf"), [label], rounds)
        finally:
            engine.stop()
    finally:
        trainer.stop()
    return row


def sharded_bench(model: str, ranks: int, rounds: int) -> dict:
    """sync_sharded.py's world of `ranks` FSDP2 ranks and one engine on their node (one copy): the
    median of its syncs, as its engine saw them."""
    from benchmarks.sync_sharded import TRAINER_NODE, engine_seconds, run_world

    world = run_world(model, ranks, (TRAINER_NODE,), rounds)
    seconds = statistics.median(engine_seconds(world))
    nbytes = world[-1]["rounds"][0]["nbytes"]
    return {"seconds": seconds, "gbps": nbytes / seconds / 1e9, "path": "bridge-shm, sharded"}


def bench_rows(model: str, ranks: int, label: str, rounds: int) -> dict:
    """The benchmark's rows for the job of `ranks` trainer ranks whose path was `label`."""
    if ranks > 1:
        return {"as_run": sharded_bench(model, ranks, rounds)}
    return {key: bench(model, label, rounds, key == "as_run") for key in BENCH_ROWS}


# ---- the report -----------------------------------------------------------------------------------
def summarize(case: dict) -> dict:
    """One rank count's job split, the benchmark's seconds per row and the job's sync over each."""
    split, bench_s = case["job"], {key: row["seconds"] for key, row in case["bench"].items()}
    return {**split, "bench_s": bench_s, "ratio": {key: split["sync_s"] / s for key, s in bench_s.items()}}


BENCH_ROWS = {
    "as_run": "benchmark, the trainer's sender set up as a run's (one copy)",
    "as_is": "benchmark as sync_end_to_end.py runs it (tensors not in shared memory: two copies)",
}
SHARDED_ROW = "benchmark, sync_sharded.py's world of {n} ranks and one engine (one copy)"


def table(cases: dict, summaries: dict) -> str:
    lines = [
        "| trainer ranks | | sync s | export | cast | transfer | load | Ray calls | GB/s | job / this |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, s in summaries.items():
        lines.append(
            f"| {n} | job (`roll-device run`), median of {s['steps']} steps | {s['sync_s']:.3f} | "
            + " | ".join(f"{s[p]:.3f}" for p in PARTS)
            + f" | {s['bytes'] / s['sync_s'] / 1e9:.2f} | |"
        )
        for key, row in cases[n]["bench"].items():
            label = BENCH_ROWS[key] if n == 1 else SHARDED_ROW.format(n=n)
            lines.append(
                f"| {n} | {label}, median | {row['seconds']:.3f} | | | | | | {row['gbps']:.2f} | "
                f"{s['ratio'][key]:.2f} |"
            )
    return "\n".join(lines)


def _verdicts(summaries: dict) -> str:
    return ", ".join(
        f"{n} rank{'s' if n > 1 else ''} **{s['ratio']['as_run']:.2f}** "
        f"({'meets' if s['ratio']['as_run'] <= GOAL else 'misses'} the goal)"
        for n, s in summaries.items()
    )


def report(results: dict, summaries: dict) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    one = summaries.get(1)
    two_copy = (
        f"; one rank against sync_end_to_end.py's two-copy row {one['ratio']['as_is']:.2f}" if one else ""
    )
    first = next(iter(summaries.values()))
    body = f"""## The job's sync vs the benchmark's same path (`benchmarks/job_sync.py`)

Run {stamp} on `cpu` ({os.cpu_count()} CPU cores, load average {results["load"][0]:.1f} at the start,
{results["load"][1]:.1f} at the end; other work shared the machine). Model: Qwen2.5-0.5B's shapes with
{results["layers"]} of its 24 decoder layers (the whole vocabulary), fp32, {first["bytes"] / 1e9:.2f} GB per
sync; fewer layers because the job's trainer (fp32, Adam) and engine beside it at 24 layers do not
fit this shared host. The job, per trainer rank count N: `roll-device run experiment=qwen05b_shapes
roles.actor_train.num_devices=N max_steps={results["steps"]}` (FSDP2 on N CPU ranks, the HF engine,
local Ray, one host: sync path `{first["path"]}`, each rank's slices over a shared-memory link of its
own, the trainer's tensors in shared memory: one copy); the steps after the first. The benchmark's
same path on the same model, median of {results["rounds"]} syncs after a warm-up: for one rank,
sync_end_to_end.py's trainer and engine processes, timed as the sender sees a sync (export to every
engine having loaded), twice: its trainer's sender set up as a run's (`share_for_one_copy`,
roll_device/pipeline/workers.py), which is the job's path, and as sync_end_to_end.py runs it (the
trainer's tensors where FSDP2 made them: packed into the slots, two copies); for N ranks,
sync_sharded.py's world of N FSDP2 ranks and one engine process on their node, each rank's slices
over its own link into the engine's weights (one copy), timed as the engine sees a sync.

**The job's sync vs the benchmark's same path** (goal <= {GOAL}): {_verdicts(summaries)}{two_copy}.
The job's split (roll_device/pipeline/sync_split.py, medians of each part, so they need not add
up): export (the trainer's export, its gathers included), cast (to the engine's dtype, timed apart
on a sharded export), transfer (the sender's seconds less export and load), load (the engine's
`update_weights`), Ray calls (the step's seconds of the sync less the sender's: the remote calls
to both roles and their results). With more than one rank the engine assembles each tensor cut
across ranks in its own weight as the pieces arrive, so that copy falls in transfer, not load.

{table(results["cases"], summaries)}

![job sync](job_sync_benchmark.png)
"""
    replace_section(DOC, "job_sync", body)


def plot(summaries: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 1.2 + 1.1 * len(summaries)))
    for n, s in summaries.items():
        left = 0.0
        for part in PARTS:
            label = part.removeprefix("sync_").removesuffix("_s") if n == min(summaries) else None
            ax.barh(f"job, {n} rank(s)", s[part], left=left, label=label, color=f"C{PARTS.index(part)}")
            left += s[part]
        ax.barh(f"benchmark, {n} rank(s)\n(one copy)", s["bench_s"]["as_run"], color="grey")
        if "as_is" in s["bench_s"]:
            ax.barh(f"benchmark, {n} rank(s)\n(two copies)", s["bench_s"]["as_is"], color="lightgrey")
    ratios = ", ".join(f"{n}: {s['ratio']['as_run']:.2f}x" for n, s in summaries.items())
    ax.set(xlabel="seconds per sync", title=f"job's sync / benchmark's, by ranks: {ratios}")
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main() -> None:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # the control store's polling waits log
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    from roll_device.models.qwen_shaped import make_qwen_shaped_model

    load, cases = [os.getloadavg()[0]], {}
    with tempfile.TemporaryDirectory(prefix="roll-device-job-sync-") as directory:
        model = str(make_qwen_shaped_model(Path(directory) / "model", num_layers=args.layers, tokenizer=True))
        for n in args.ranks:
            say(f"the job: {n} trainer rank(s), {args.steps} steps")
            split = job_split(job_alone(model, n, args.steps, str(Path(directory) / f"run-{n}")))
            say(f"  {split}")
            say(f"the benchmark: {LABELS[split['path']]}, {n} rank(s)")
            cases[n] = {"job": split, "bench": bench_rows(model, n, LABELS[split["path"]], args.rounds)}
    load.append(os.getloadavg()[0])
    results = {
        "cases": cases,
        "layers": args.layers,
        "steps": args.steps,
        "rounds": args.rounds,
        "load": load,
    }
    summaries = {n: summarize(case) for n, case in cases.items()}
    for n, s in summaries.items():
        say(f"{n} rank(s): job sync {s['sync_s']:.3f}s vs benchmark {s['bench_s']}: {s['ratio']}")
    save_results(RESULTS, results, summaries)
    report(results, summaries)
    plot(summaries)


if __name__ == "__main__":
    main()
