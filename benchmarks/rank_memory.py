"""Where one FSDP2 trainer rank's memory goes in a step of the 0.5B-shaped experiment
(`experiment=qwen05b_shapes`: its trainer settings, its weight sync, its batch shape), measured
on 2 local ranks (gloo on the CPU) at reduced depth (`--layers`, default 4 and 8 of Qwen2.5-0.5B's
24 decoder layers, the full 151,936-token vocabulary) and fitted per layer, so that 24 layers are
predicted without running them (`--layers 24` runs them: about 10 GB per rank).

Each rank samples its /proc/self/status every 2 ms with a thread and attributes each sample to
the phase it falls in: load; old logprobs (`forward_logprobs`); train forward, backward (with the
gradient clipping) and optimizer step (`train_step`, split by wrapping `Tensor.backward` and the
clipping); the weight export of the sync (rank 0 sends to a real `WeightSender` over the
experiment's plan, a receiver in another process; rank 1 drains its export); and between steps.
Per phase: the peak and end of RssAnon (memory the process owns), RssFile (mapped file pages:
the checkpoint, the libraries) and RssShmem (the sync's shared-memory slots), and glibc's own
account at the phase's end (`mallinfo2`: bytes in use in its heaps, free bytes it keeps, bytes in
mmapped chunks). The sharded state (parameters, gradients, Adam moments) is counted from the
tensors. Results replace the rank_memory section of docs/benchmarks.md; the plot goes to
docs/rank_memory_benchmark.png.

    MALLOC_ARENA_MAX=2 .venv/bin/python benchmarks/rank_memory.py [--layers 4 8] [--steps 2]
"""

from __future__ import annotations

import argparse
import collections
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section

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
    """Bytes of RssAnon that glibc's `malloc_trim(0)` gives back to the OS now."""
    before = status()["RssAnon"]
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return before - status()["RssAnon"]


def status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in FIELDS:
                values[key] = int(line.split()[1]) * 1024
    return values


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
        out = {p: {"peak": self.peaks[p], "end": self.ends[p], "seconds": self.seconds[p]} for p in self.peaks}
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
    """The trainer's side of a weight sync, as `TrainWorker.send_weights` runs it: rank 0 sends,
    the other ranks drain the export (it gathers); then the host heap's free memory goes back."""
    from roll_device.platforms import release_host_heap

    export = trainer.export_weights(dtype=None, snapshot=False)
    if sender is None:
        collections.deque(export, maxlen=0)
    else:
        sender.send(export, version=version)
    del export
    release_host_heap()


def rank_main(rank: int, model_path: str, steps: int) -> dict:
    """Load and `steps` pipeline steps of the experiment's trainer; per step and phase, the meter's
    account, and the sharded state at the end of each step."""
    import roll_device as rd
    from benchmarks.train_memory import import_model_code
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


def fit(runs: list[dict], key) -> tuple[float, float]:
    """Per-layer and fixed parts of `key(run)` from the two shallowest runs, MiB."""
    a, b = sorted(runs, key=lambda r: r["layers"])[:2]
    per_layer = (key(b) - key(a)) / (b["layers"] - a["layers"])
    return per_layer, key(a) - per_layer * a["layers"]


def main() -> None:
    from roll_device.models.qwen_shaped import make_qwen_shaped_model
    from strategies.training.local_ranks import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--label", default="", help="a name for this run in the results file")
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "rank_memory_results.json"))
    args = parser.parse_args()
    work = Path(tempfile.gettempdir()) / "roll-device-train-memory"
    env = {"OMP_NUM_THREADS": "1"}  # MALLOC_ARENA_MAX, read when a process starts, is inherited
    runs = []
    for layers in args.layers:
        model = make_qwen_shaped_model(work / f"qwen-{layers}", num_layers=layers)
        ranks = run_ranks("benchmarks.rank_memory:rank_main", 2, str(model), args.steps, env=env, timeout=3000)
        runs.append(summarize(layers, ranks))
        for rank, result in enumerate(runs[-1]["ranks"]):
            peaks = {p: round(v["peak"]["RssAnon"]) for p, v in result["steps"][-1]["phases"].items()}
            say(f"{layers} layers, rank {rank}: last step's RssAnon peaks (MiB) {peaks}")
    results = Path(args.results)
    stored = json.loads(results.read_text()) if results.exists() else {}
    stored[args.label or "latest"] = {
        "date": str(datetime.date.today()),
        "machine": f"{host.processor() or host.machine()}, {os.cpu_count()} cores, CPU (gloo), not simulated",
        "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX", "glibc default"),
        "runs": runs,
    }
    results.write_text(json.dumps(stored, indent=1))
    say(f"wrote {results}")


if __name__ == "__main__":
    main()
