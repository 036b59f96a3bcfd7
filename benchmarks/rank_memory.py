"""Where one FSDP2 trainer rank's memory goes in a step of the 0.5B-shaped experiment
(`experiment=qwen05b_shapes`: its trainer settings, its weight sync, its batch shape), measured
on 2 local ranks (gloo on the CPU) at reduced depth (`--layers`, default 4, 8 and 12 of
Qwen2.5-0.5B's 24 decoder layers, the full 151,936-token vocabulary) and fitted per layer (least
squares), so that 24 layers are predicted without running them (`--layers 24` runs them: about
7 GiB per rank, ask `free -g` first).

Each rank samples its /proc/self/status every 2 ms with a thread and attributes each sample to
the phase it falls in: load; old logprobs (`forward_logprobs`); train forward, backward (with the
gradient clipping) and optimizer step (`train_step`, split by wrapping `Tensor.backward` and the
clipping); the weight export of the sync (rank 0 sends to a real `WeightSender` over the
experiment's plan, a receiver in another process; rank 1 drains its export); and between steps.
Per phase: the peak and end of RssAnon (memory the process owns), RssFile (mapped file pages:
the checkpoint, the libraries) and RssShmem (the sync's shared-memory slots), glibc's own
account at the phase's end (`mallinfo2`: bytes in use in its heaps, free bytes it keeps, bytes in
mmapped chunks), the seconds it took, and after the step what `malloc_trim(0)` gives back. The
sharded state (parameters, gradients, Adam moments) is counted from the tensors. `--collectives`
also times gloo's all-gather, reduce-scatter and `full_tensor` against the in-place ones.
Results replace the rank_memory section of docs/benchmarks.md (benchmarks/rank_memory_report.py
writes it and the plot, docs/rank_memory_benchmark.png; benchmarks/phase_meter.py is the meter).

    MALLOC_ARENA_MAX=2 .venv/bin/python benchmarks/rank_memory.py [--layers 4 8 12] [--label after] [--collectives]

Runs are kept by label and depth in results/rank_memory.json (`--layers` with no depth only
writes the section again from it): `after`, this tree's code, is the one the section shows;
`check` holds 4, 8, 12 and one measured 24-layer run of one code, the fit's check; other labels
keep runs of earlier code for comparisons (`before`: commit 70cd4ed's code, this file run from a
`git archive` of it with `--results` pointing here; the measurements log of docs/benchmarks.md
compares them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as host
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section
from benchmarks.phase_meter import FIELDS, PhaseMeter, glibc_account, instrument, status, trimmable
from benchmarks.rank_memory_report import CURRENT, PLOT, plot, render
from benchmarks.train_memory import import_model_code

DOC = ROOT / "docs" / "benchmarks.md"
EXPERIMENT = "experiment=qwen05b_shapes"
MIB = 2**20


def say(message: str) -> None:
    print(f"[rank-memory {time.strftime('%H:%M:%S')}] {message}", flush=True)


def step_batch(rank: int, config):
    """One rank's rows as the experiment makes them: its share of prompts x samples, each the
    prompt and `max_new_tokens` (some stopped early), padded to the longest."""
    import torch

    from strategies.base import TrainBatch

    rows = config.data.prompts_per_step * config.algorithm.samples_per_prompt // 2
    prompt, new = config.data.prompt_length, config.algorithm.max_new_tokens
    g = torch.Generator().manual_seed(rank)
    width = prompt + new
    ids = torch.randint(3, 40, (rows, width), generator=g)
    attention = torch.ones(rows, width, dtype=torch.long)
    for row in range(rows):
        attention[row, prompt + new - 4 * (row % 3) :] = 0
    response = attention.float()
    response[:, :prompt] = 0
    return TrainBatch(ids * attention, attention, response, advantages=torch.randn(rows, generator=g))


def state_bytes(trainer) -> dict[str, int]:
    """This rank's sharded state: parameters, gradients and Adam moments, in bytes."""
    params = list(trainer.model.parameters())
    local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
    grads = [p.grad for p in params if p.grad is not None]
    moments = [
        v for s in trainer.optimizer.state.values() for v in s.values() if getattr(v, "dim", lambda: 0)() > 0
    ]

    def nbytes(tensors) -> int:
        return sum(
            (t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size() for t in tensors
        )

    return {"params": nbytes(local), "grads": nbytes(grads), "adam": nbytes(moments)}


def receiver_main(endpoint, steps: int) -> None:
    """The rollout end of the sync in its own process: receives and drops each bucket."""
    import roll_device as rd
    from roll_device.comm import WeightReceiver

    receiver = WeightReceiver(endpoint, 1, rd.get_platform("cpu"), timeout_s=600)
    receiver.connect()
    for _ in range(steps):
        receiver.receive(lambda named: [None for _ in named])
    receiver.close()


def open_sync(config, steps: int):
    """Rank 0's sender of the experiment's sync plan (trainer and rollout on this host's CPU, not
    colocated) and its receiver process."""
    import multiprocessing as mp

    import roll_device as rd
    from roll_device.comm import WeightSender, plan_sync

    plan = plan_sync("cpu", "cpu", colocated=False, same_node=True, forced=config.weight_sync.path)
    sender = WeightSender(plan, rd.get_platform("cpu"), 1, config.weight_sync)
    receiver = mp.get_context("spawn").Process(target=receiver_main, args=(sender.endpoint, steps))
    receiver.start()
    sender.connect()
    return sender, receiver, plan.describe()


def sync(trainer, sender, version: int) -> None:
    """The trainer's side of a weight sync: the pipeline's own `TrainWorker.send_weights` on a
    stand-in worker (the trainer, rank 0's sender, weights as trained): rank 0 sends, the other
    rank drains the export (it gathers to rank 0)."""
    from roll_device.pipeline.workers import TrainWorker

    worker = SimpleNamespace(
        strategy=trainer, sender=sender, export_dtype=None, sender_rank=TrainWorker.sender_rank
    )
    TrainWorker.send_weights(worker, version)


def rank_main(rank: int, model_path: str, steps: int) -> dict:
    """Load and `steps` pipeline steps of the experiment's trainer; per step and phase, the meter's
    account, and the sharded state at the end of each step."""
    import roll_device as rd
    from benchmarks.configs import changed, run_config
    from strategies.registry import strategy_class
    from strategies.training.losses import grpo_policy_loss

    config = run_config(EXPERIMENT)
    settings = changed(config.trainer, "trainer", max_grad_norm=1e9)  # no clipping that could refuse
    platform = rd.current_platform()
    trainer = strategy_class("train", "fsdp", platform.kind)(platform)
    import_model_code(model_path)
    sender, receiver, plan = open_sync(config, steps) if rank == 0 else (None, None, None)
    meter = PhaseMeter()
    instrument(meter)
    base = {**status(), **glibc_account()}
    meter.mark("load")
    trainer.initialize(model_path, settings)
    out = {"base": base, "load": meter.take(), "steps": [], "plan": plan}
    for step in range(1, steps + 1):
        batch = step_batch(rank, config)
        meter.mark("logprobs")
        batch.old_logprobs = trainer.forward_logprobs(batch)
        meter.mark("forward")
        trainer.train_step(batch, grpo_policy_loss())
        meter.mark("export")
        sync(trainer, sender, step)
        meter.mark("between")
        time.sleep(0.5)
        phases = meter.take()
        out["steps"].append({"phases": phases, "state": state_bytes(trainer), "trimmable": trimmable()})
    out["config"] = {
        "vocab": trainer.model.config.vocab_size,
        "hidden": trainer.model.config.hidden_size,
        "params": sum(p.numel() for p in trainer.model.parameters()),
    }
    if sender is not None:
        receiver.join(timeout=120)
        sender.close()
    trainer.shutdown()
    return out


def collectives_rank(rank: int, rows: int, cols: int, repeats: int) -> dict:
    """gloo's all-gather, reduce-scatter and `full_tensor` vs the in-place ones on a tensor of the
    root unit's size, alternating, in one run: per pair the median seconds and the peak RssAnon
    above the call's start (MiB)."""
    import statistics

    import torch.distributed as dist

    meter = PhaseMeter()
    out = {}
    for name, calls in collective_pairs(rank, rows, cols).items():
        seconds: list[list[float]] = [[], []]
        peaks = [0.0, 0.0]
        for _ in range(repeats):
            for i, call in enumerate(calls):
                dist.barrier()
                meter.mark(name)
                start_anon, start = status()["RssAnon"], time.perf_counter()
                call()
                seconds[i].append(time.perf_counter() - start)
                account = meter.take()[name]
                peaks[i] = max(peaks[i], (account["peak"]["RssAnon"] - start_anon) / MIB)
        out[name] = {
            "gloo": statistics.median(seconds[0]),
            "in_place": statistics.median(seconds[1]),
            "peaks": peaks,
        }
    meter.running = False
    return out


def collective_pairs(rank: int, rows: int, cols: int) -> dict:
    """Per collective, gloo's own call and the in-place one, on a `rows` x `cols` fp32 tensor."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from strategies.training.in_place_collectives import InPlaceAllGather, InPlaceReduceScatter, whole_tensor

    group, world = dist.group.WORLD, dist.get_world_size()
    numel = rows * cols
    full = torch.randn(numel)
    sharded = distribute_tensor(full.view(rows, cols), init_device_mesh("cpu", (world,)), [Shard(0)])
    shard = full[: numel // world].clone()

    def gloo_gather():
        dist.all_gather_into_tensor(torch.empty(numel), shard)

    def own_gather():
        out = torch.empty(numel)
        out.view(world, -1)[rank].copy_(shard)
        InPlaceAllGather()(out, out.view(world, -1)[rank], group)

    def gloo_reduce():
        dist.reduce_scatter_tensor(torch.empty(numel // world), full.clone(), op=dist.ReduceOp.AVG)

    def own_reduce():
        InPlaceReduceScatter()(torch.empty(numel // world), full.clone(), group, dist.ReduceOp.AVG)

    return {
        "all-gather": (gloo_gather, own_gather),
        "reduce-scatter (AVG)": (gloo_reduce, own_reduce),
        "whole tensor (export)": (sharded.full_tensor, lambda: whole_tensor(sharded, True)),
        "whole tensor to rank 0 (sync export)": (
            sharded.full_tensor,
            lambda: whole_tensor(sharded, True, to_rank=0),
        ),
    }


def compact(stored: dict) -> str:
    """The results as JSON, MiB and seconds to 0.01, one line per label."""

    def rounded(value):
        if isinstance(value, float):
            return round(value, 2)
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return value

    lines = [f"{json.dumps(k)}: {json.dumps(rounded(v), separators=(',', ':'))}" for k, v in stored.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def rss(account: dict) -> dict[str, float]:
    return {k: account.get(k, 0) / MIB for k in (*FIELDS, "in_use", "kept", "mmapped")}


def summarize_rank(result: dict) -> dict:
    """One rank's load and steps, MiB: per phase the peaks and ends, with the state."""
    steps = [
        {
            "phases": {
                p: {"peak": rss(v["peak"]), "end": rss(v["end"]), "seconds": v["seconds"]}
                for p, v in step["phases"].items()
            },
            "state": {k: v / MIB for k, v in step["state"].items()},
            "trimmable": step["trimmable"] / MIB,
        }
        for step in result["steps"]
    ]
    load = result["load"]["load"]
    return {
        "base": rss(result["base"]),
        "load": {"peak": rss(load["peak"]), "end": rss(load["end"])},
        "steps": steps,
    }


def summarize(layers: int, ranks: list[dict]) -> dict:
    config = ranks[0]["config"]
    return {
        "layers": layers,
        "params": config["params"],
        "root": config["vocab"] * config["hidden"] * 4 / MIB,
        "plan": ranks[0]["plan"],
        "ranks": [summarize_rank(r) for r in ranks],
    }


def main() -> None:
    from roll_device.models.qwen_shaped import make_qwen_shaped_model
    from strategies.training.local_ranks import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[4, 8, 12])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument(
        "--label", default=CURRENT, help="the code measured: after (this tree), check, before"
    )
    parser.add_argument(
        "--collectives", action="store_true", help="also time gloo's collectives vs the in-place ones"
    )
    parser.add_argument("--results", default=str(ROOT / "results" / "rank_memory.json"))
    args = parser.parse_args()
    results = Path(args.results)
    stored = json.loads(results.read_text()) if results.exists() else {}
    work = Path(tempfile.gettempdir()) / "roll-device-train-memory"
    env = {"OMP_NUM_THREADS": "1"}  # MALLOC_ARENA_MAX, read when a process starts, is inherited
    runs = []
    for layers in args.layers:
        model = make_qwen_shaped_model(work / f"qwen-{layers}", num_layers=layers)
        ranks = run_ranks(
            "benchmarks.rank_memory:rank_main", 2, str(model), args.steps, env=env, timeout=3000
        )
        runs.append(summarize(layers, ranks))
        for rank, result in enumerate(runs[-1]["ranks"]):
            peaks = {p: round(v["peak"]["RssAnon"]) for p, v in result["steps"][-1]["phases"].items()}
            say(f"{layers} layers, rank {rank}: last step's RssAnon peaks (MiB) {peaks}")
    if args.collectives:
        ranks = run_ranks("benchmarks.rank_memory:collectives_rank", 2, 151936, 896, 5, env=env, timeout=900)
        stored["collectives"] = {"date": str(datetime.date.today()), "ranks": ranks}
        results.write_text(compact(stored))
        say(f"collectives: {ranks[0]}")
    if runs:
        kept = [r for r in stored.get(args.label, {}).get("runs", []) if r["layers"] not in args.layers]
        stored[args.label] = {
            "date": str(datetime.date.today()),
            "machine": f"{host.processor() or host.machine()}, {os.cpu_count()} cores, CPU (gloo), not simulated",
            "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX", "glibc default"),
            "runs": sorted(kept + runs, key=lambda r: r["layers"]),
        }
        results.write_text(compact(stored))
        say(f"wrote {results}")
    if CURRENT in stored:
        plot(stored)
        replace_section(DOC, "rank_memory", render(stored))
        say(f"wrote {DOC.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
