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
Results replace the rank_memory section of docs/benchmarks.md; the plot goes to
docs/rank_memory_benchmark.png.

    MALLOC_ARENA_MAX=2 .venv/bin/python benchmarks/rank_memory.py [--layers 4 8 12] [--label after] [--collectives]

Runs are kept by label and depth in benchmarks/rank_memory_results.json (`--layers` with no
depth only writes the section again from it): `before` (commit 70cd4ed's code: this file run
from a `git archive` of it with `--results` pointing here), `after` (this tree), and `check`
(the code with the first two cuts, 4, 8, 12 and one measured 24-layer run: the fit's check).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform as host
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section
from benchmarks.train_memory import import_model_code
from roll_device.platforms import process_status, release_host_heap

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "rank_memory_benchmark.png"
EXPERIMENT = "experiment=qwen05b_shapes"
FIELDS = ("RssAnon", "RssFile", "RssShmem")
PHASES = ("load", "logprobs", "forward", "backward", "optimizer", "export", "between")
MIB = 2**20


def say(message: str) -> None:
    print(f"[rank-memory {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def glibc_account() -> dict[str, int]:
    """glibc malloc's bytes over all its arenas: in use (`in_use`), free but kept (`kept`), and in
    chunks of their own mapping (`mmapped`, returned to the OS when freed)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    info = libc.mallinfo2()
    return {"in_use": info.uordblks, "kept": info.fordblks, "mmapped": info.hblkhd}


def trimmable() -> int:
    """Bytes of RssAnon that glibc's `malloc_trim(0)` (the platform's `release_host_heap`) gives
    back to the OS now."""
    before = status()["RssAnon"]
    release_host_heap()
    return before - status()["RssAnon"]


def status() -> dict[str, int]:
    return process_status(*FIELDS)


class PhaseMeter:
    """Per phase: the peak of each /proc field over its samples, its value at the phase's end, and
    glibc's account then. `mark(name)` ends the current phase and starts `name` (a phase met again,
    in the next micro-batch, goes on accumulating its peak)."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.peaks: dict[str, dict[str, int]] = {}
        self.ends: dict[str, dict] = {}
        self.seconds: dict[str, float] = {}
        self._since = time.perf_counter()
        self._lock = threading.Lock()
        self.running = True
        threading.Thread(target=self._sample, daemon=True).start()

    def _record(self) -> dict[str, int]:
        values = status()
        with self._lock:
            if self.phase is not None:
                peak = self.peaks.setdefault(self.phase, dict(values))
                for key, value in values.items():
                    peak[key] = max(peak[key], value)
        return values

    def _sample(self) -> None:
        while self.running:
            self._record()
            time.sleep(0.002)

    def mark(self, phase: str | None) -> None:
        now = time.perf_counter()
        if self.phase is not None:
            self.ends[self.phase] = {**self._record(), **glibc_account()}
            self.seconds[self.phase] = self.seconds.get(self.phase, 0.0) + now - self._since
        self._since = now
        with self._lock:
            self.phase = phase
        if phase is not None:
            self._record()

    def take(self) -> dict:
        """The phases measured since the last take, and a fresh start."""
        self.mark(None)
        out = {
            p: {"peak": self.peaks[p], "end": self.ends[p], "seconds": self.seconds[p]} for p in self.peaks
        }
        self.peaks, self.ends, self.seconds = {}, {}, {}
        return out


def instrument(meter: PhaseMeter) -> None:
    """Mark the train step's phases: a backward (and the clipping after the last one) and the
    optimizer step; the next micro-batch's forward starts when a backward returns."""
    import torch

    backward, clip = torch.Tensor.backward, torch.nn.utils.clip_grad_norm_

    def marked_backward(self, *args, **kwargs):
        meter.mark("backward")
        backward(self, *args, **kwargs)
        meter.mark("forward")

    def marked_clip(*args, **kwargs):
        meter.mark("backward")
        norm = clip(*args, **kwargs)
        meter.mark("optimizer")
        return norm

    torch.Tensor.backward = marked_backward
    torch.nn.utils.clip_grad_norm_ = marked_clip


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
    from strategies.registry import strategy_class
    from strategies.training.losses import grpo_policy_loss
    from tests.configs import changed, run_config

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

    pairs = {
        "all-gather": (gloo_gather, own_gather),
        "reduce-scatter (AVG)": (gloo_reduce, own_reduce),
        "whole tensor (export)": (sharded.full_tensor, lambda: whole_tensor(sharded, True)),
        "whole tensor to rank 0 (sync export)": (
            sharded.full_tensor,
            lambda: whole_tensor(sharded, True, to_rank=0),
        ),
    }
    meter = PhaseMeter()
    out = {}
    for name, calls in pairs.items():
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


STEP_PHASES = PHASES[1:]
STATE_IN = {"backward": ("params", "adam", "grads"), "optimizer": ("params", "adam", "grads")}


def peak(run: dict, phase: str, field: str = "RssAnon") -> float:
    """Rank 0's (the sender's) peak of `field` in `phase` of the last step (load: the load), MiB."""
    return phase_of(run["ranks"][0], phase)["peak"][field]


def phase_of(rank: dict, phase: str) -> dict:
    return rank["load"] if phase == "load" else rank["steps"][-1]["phases"][phase]


def state_in(run: dict, phase: str) -> float:
    """The sharded state a rank holds in `phase`: parameters, Adam moments once the first step
    made them, gradients from the backward to the optimizer step (their full size), MiB."""
    state = run["ranks"][0]["steps"][-1]["state"]
    if phase == "load":
        return state["params"]
    return sum(state[k] if k != "grads" else state["params"] for k in STATE_IN.get(phase, ("params", "adam")))


def fitted(runs: list[dict], key) -> dict[str, float]:
    """`key(run)` split into a per-layer and a fixed part by least squares over the reduced depths,
    and its value at 24 layers, MiB."""
    import numpy as np

    shallow = [r for r in runs if r["layers"] < 24]
    per_layer, fixed = np.polyfit([r["layers"] for r in shallow], [key(r) for r in shallow], 1)
    return {"per_layer": float(per_layer), "fixed": float(fixed), "24": float(fixed + 24 * per_layer)}


def breakdown(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per phase at 24 layers (measured where a 24-layer run exists, else fitted): the higher
    RssAnon peak, the interpreter, the sharded state, the rest, and the RssFile and RssShmem peaks
    (rank 0: the sender), MiB."""
    full = [r for r in runs if r["layers"] == 24]

    def at24(key) -> float:
        return key(full[0]) if full else fitted(runs, key)["24"]

    out = {}
    for phase in PHASES:
        anon = at24(lambda r, p=phase: peak(r, p))
        base = at24(lambda r: r["ranks"][0]["base"]["RssAnon"])
        state = at24(lambda r, p=phase: state_in(r, p))
        out[phase] = {
            "anon": anon,
            "base": base,
            "state": state,
            "rest": anon - base - state,
            "file": at24(lambda r, p=phase: phase_of(r["ranks"][0], p)["peak"]["RssFile"]),
            "shmem": at24(lambda r, p=phase: phase_of(r["ranks"][0], p)["peak"]["RssShmem"]),
        }
    return out


def render(stored: dict) -> str:
    before, after = stored["before"], stored["after"]
    root = after["runs"][0]["root"]
    layers = sorted({r["layers"] for r in before["runs"]} & {r["layers"] for r in after["runs"]})
    check = stored.get("check", {"runs": []})["runs"]  # the fit checked against one 24-layer run
    full = [r for r in check if r["layers"] == 24]
    by = {(label, r["layers"]): r for label in ("before", "after") for r in stored[label]["runs"]}
    fit_b = {p: fitted(before["runs"], lambda r, p=p: peak(r, p)) for p in PHASES}
    fit_a = {p: fitted(after["runs"], lambda r, p=p: peak(r, p)) for p in PHASES}
    lines = [
        "## Where a trainer rank's memory goes (`benchmarks/rank_memory.py`)",
        "",
        (
            f"{after['date']}, {after['machine']}, `MALLOC_ARENA_MAX={after['malloc_arena_max']}`. The "
            "0.5B-shaped experiment's trainer (`experiment=qwen05b_shapes`: FSDP2 on 2 ranks, fp32, packing, "
            "recomputation, logprob chunks of 32, 64-token micro-batches, 4 rows of 22 tokens per rank) with "
            "Qwen2.5-0.5B's shapes at reduced depth (the full 151,936-token vocabulary), and its weight "
            f"sync ({after['runs'][0]['plan']}) to a receiver process. Peak anonymous resident memory "
            "(RssAnon) of rank 0 (the sender) in each phase of the second step (the first makes the Adam "
            "moments), MiB; **before**: the code of commit 70cd4ed, **after**: in-place collectives on "
            "gloo, the host heap trimmed after each sync, and the chunked head's weight gradient added "
            "to in place (measured again with the sync's export gathered to rank 0 alone). The 24-layer "
            "columns are least-squares fits (fixed + per layer) over the reduced depths."
        ),
        "",
        "| phase | "
        + " | ".join(f"{n} layers before | {n} after" for n in layers)
        + " | per layer (after) | 24 fitted: before | after |",
        "|---|" + "---:|" * (2 * len(layers) + 3),
    ]
    for phase in PHASES:
        cells = [f"{peak(by[label, n], phase):.0f}" for n in layers for label in ("before", "after")]
        cells += [
            f"{fit_a[phase]['per_layer']:.0f}",
            f"{fit_b[phase]['24']:.0f}",
            f"**{fit_a[phase]['24']:.0f}**",
        ]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    if full:
        worst = max(
            abs(fitted(check, lambda r, p=p: peak(r, p))["24"] / peak(full[0], p) - 1) for p in PHASES
        )
        lines += [
            "",
            (
                "The fit, checked once at full depth: with the first two cuts only (in-place collectives, "
                "the trim), a measured 24-layer run and that code's fit over 4, 8 and 12 layers agree "
                f"within {worst:.0%} in every phase (measured: "
                + ", ".join(f"{p} {peak(full[0], p):.0f}" for p in PHASES)
                + ")."
            ),
        ]
    parts = breakdown(after["runs"])
    lines += [
        "",
        (
            "At 24 layers (after; fitted), each phase's peak split into the interpreter and libraries (RssAnon before loading), "
            "the sharded state counted from its tensors (parameters and Adam moments; gradients, at "
            "their full size, in the backward and the optimizer step) and the rest: the gathered root unit "
            f"(embedding = tied head, {root:.0f} MiB in fp32), its gradient, a layer's gathered parameters, "
            "activations and logits chunks, collective buffers, and free memory glibc keeps. The rest is "
            "also given in root-unit sizes; in the train forward it includes, from the second "
            "micro-batch on, the first one's gradients. RssFile and RssShmem are rank 0's (the "
            "sender's) peaks."
        ),
        "",
        "| phase | RssAnon peak | interpreter | sharded state | rest | rest / root | RssFile | RssShmem |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase, v in parts.items():
        lines.append(
            f"| {phase} | {v['anon']:.0f} | {v['base']:.0f} | {v['state']:.0f} | {v['rest']:.0f} | "
            f"{v['rest'] / root:.1f} | {v['file']:.0f} | {v['shmem']:.0f} |"
        )
    trims = {
        label: max(rank["steps"][-1]["trimmable"] for run in stored[label]["runs"] for rank in run["ranks"])
        for label in ("before", "after")
    }
    if "collectives" in stored:
        lines += ["", *collectives_table(stored["collectives"])]
    lines += [
        "",
        (
            f"Free memory glibc kept between steps, which `malloc_trim(0)` gave back at once: up to "
            f"{trims['before']:.0f} MiB per rank before, {trims['after']:.0f} MiB after (the trainer "
            "worker now trims after each sync). In the export the other rank sends its shards to "
            "rank 0 and receives nothing; it peaks there at "
            + ", ".join(f"{phase_of(r['ranks'][1], 'export')['peak']['RssAnon']:.0f}" for r in after["runs"])
            + " MiB at "
            + ", ".join(str(r["layers"]) for r in after["runs"])
            + " layers (rank 0: "
            + ", ".join(f"{peak(r, 'export'):.0f}" for r in after["runs"])
            + ") and holds no shared memory."
        ),
        "",
        "![rank memory](rank_memory_benchmark.png)",
    ]
    return "\n".join(lines)


def collectives_table(measured: dict) -> list[str]:
    """gloo's collectives vs the in-place ones (`--collectives`): the slower rank's medians, each
    rank's peak."""
    names = list(measured["ranks"][0])
    lines = [
        (
            f"The collectives behind the cut, {measured['date']}, same machine: a tensor of the root "
            "unit's size (151,936 x 896 fp32, 519 MiB) on 2 gloo ranks, gloo's own call and the "
            "in-place one alternating, 5 times each; median seconds (the slower rank) and each "
            "rank's peak RssAnon above the call's start (MiB, rank 0 / rank 1; the reduce-scatter's "
            "includes its 519 MiB input). A weight sync's export gathers to the sender alone (rank "
            "0; the other rank sends its shard and receives nothing), against `full_tensor` on both:"
        ),
        "",
        "| collective | gloo s | in place s | in place / gloo | gloo peak | in-place peak |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        gloo = max(r[name]["gloo"] for r in measured["ranks"])
        own = max(r[name]["in_place"] for r in measured["ranks"])
        peaks = [" / ".join(f"{r[name]['peaks'][i]:.0f}" for r in measured["ranks"]) for i in (0, 1)]
        lines.append(f"| {name} | {gloo:.2f} | {own:.2f} | **{own / gloo:.2f}x** | {peaks[0]} | {peaks[1]} |")
    return lines


def plot(stored: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    xs = range(len(PHASES))
    for offset, label in ((-0.2, "before"), (0.2, "after")):
        fits = [fitted(stored[label]["runs"], lambda r, p=p: peak(r, p))["24"] for p in PHASES]
        left.bar([x + offset for x in xs], fits, 0.4, label=label)
    left.set_xticks(list(xs), PHASES, rotation=20)
    left.set_ylabel("peak RssAnon per rank, MiB")
    depths = ", ".join(str(r["layers"]) for r in stored["after"]["runs"] if r["layers"] < 24)
    left.set_title(f"24 layers (fitted over {depths} layers), before vs after")
    left.legend()
    parts = breakdown(stored["after"]["runs"])
    bottom = [0.0] * len(PHASES)
    for key, name in (("base", "interpreter"), ("state", "sharded state"), ("rest", "rest (root unit, ...)")):
        values = [parts[p][key] for p in PHASES]
        right.bar(list(xs), values, 0.6, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_xticks(list(xs), PHASES, rotation=20)
    measured = any(r["layers"] == 24 for r in stored["after"]["runs"])
    right.set_title(f"24 layers ({'measured' if measured else 'fitted'}), after: what the peak holds")
    right.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main() -> None:
    from roll_device.models.qwen_shaped import make_qwen_shaped_model
    from strategies.training.local_ranks import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[4, 8, 12])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--label", default="after", help="before | after | check: the code measured")
    parser.add_argument(
        "--collectives", action="store_true", help="also time gloo's collectives vs the in-place ones"
    )
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "rank_memory_results.json"))
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
    if "before" in stored and "after" in stored:
        plot(stored)
        replace_section(DOC, "rank_memory", render(stored))
        say(f"wrote {DOC.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
