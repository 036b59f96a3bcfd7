"""Memory and speed of the FSDP2 trainer's features for real sizes, measured in one run on this
machine's platform, 2 local ranks (gloo on the CPU), every rank one intra-op thread:

- peak memory per rank while loading a model of Qwen2.5-0.5B's shapes (`--layers` of its 24
  decoder layers): shard by shard from the safetensors files (the trainer) vs the whole fp32
  model loaded and then sharded (the plain way), against the rank's own share of
  the parameters;
- peak memory per rank of a forward (logprobs) and of a train step at a long sequence
  (`--length` tokens, one row per rank) with each feature off vs on: activation recomputation,
  chunked logprobs (`--chunk` positions), packing, all three;
- tokens/s of packed vs padded training on the tiny model, a batch whose padding is half its
  tokens (goal: packed >= 1.3x padded).

Memory on the CPU is each process's anonymous resident memory (RssAnon: mapped checkpoint files
left out) sampled every 2 ms by a thread, per phase (peak minus the value when the phase began). Results replace the train_memory section of
docs/benchmarks.md; the plot goes to docs/train_memory_benchmark.png.

    .venv/bin/python benchmarks/train_memory.py [--layers 2] [--length 512] [--chunk 128]
"""

from __future__ import annotations

import argparse
import datetime
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
from roll_device.platforms import process_status

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "train_memory_benchmark.png"
OFF = {"recompute": False, "packing": False, "max_tokens_per_micro_batch": None, "logprob_chunk_tokens": None}
FEATURES = [  # (label, trainer changes; {chunk} and {length} are filled in)
    ("all off", {}),
    ("recompute", {"recompute": True}),
    ("chunked logprobs", {"logprob_chunk_tokens": "{chunk}"}),
    ("packing", {"packing": True, "max_tokens_per_micro_batch": "{length}"}),
    (
        "all on",
        {
            "recompute": True,
            "logprob_chunk_tokens": "{chunk}",
            "packing": True,
            "max_tokens_per_micro_batch": "{length}",
        },
    ),
]
ENV = {"OMP_NUM_THREADS": "1"}
ATTENTION = ("sdpa", "eager")  # transformers kernels compared for packing


def say(message: str) -> None:
    print(f"[train-memory {time.strftime('%H:%M:%S')}] {message}", flush=True)


class PeakRss:
    """The peak anonymous resident memory of this process over a phase (RssAnon: the memory the
    process owns, not the safetensors pages it maps from the page cache), sampled by a thread."""

    def __init__(self) -> None:
        self.peak = self.start = self.now()
        self.running = True
        threading.Thread(target=self._sample, daemon=True).start()

    def now(self) -> int:
        return process_status("RssAnon")["RssAnon"]

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.now())
            time.sleep(0.002)

    def phase(self, work) -> int:
        """Run `work()`; its peak above the resident set when it began, in bytes."""
        self.start = self.peak = self.now()
        work()
        time.sleep(0.01)
        return max(self.peak, self.now()) - self.start


def long_batch(length: int, rows: int = 1, real: list[int] | None = None, seed: int = 0):
    import torch

    from strategies.base import TrainBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 40, (rows, length), generator=g)
    attention = torch.ones(rows, length, dtype=torch.long)
    for row, n in enumerate(real or []):
        attention[row, n:] = 0
    response = attention.float()
    response[:, :16] = 0
    return TrainBatch(ids * attention, attention, response, advantages=torch.randn(rows, generator=g))


def trainer_with(model_path: str, changes: dict):
    import roll_device as rd
    from benchmarks.configs import trainer_settings
    from strategies.registry import strategy_class

    platform = rd.current_platform()
    trainer = strategy_class("train", "fsdp", platform.kind)(platform)
    trainer.initialize(model_path, trainer_settings("fsdp", **{**OFF, **changes}))
    return trainer


def memory_rank(rank: int, model_path: str, changes: dict, length: int) -> dict:
    """Load (shard by shard), a forward and a train step at `length` tokens; peaks per phase (the
    settings are read and the model's code imported before the load phase)."""
    import roll_device as rd
    from benchmarks.configs import trainer_settings
    from strategies.registry import strategy_class
    from strategies.training.losses import grpo_policy_loss

    platform = rd.current_platform()
    settings = trainer_settings("fsdp", **{**OFF, **changes})
    trainer = strategy_class("train", "fsdp", platform.kind)(platform)
    import_model_code(model_path)
    rss = PeakRss()
    out = {"load": rss.phase(lambda: trainer.initialize(model_path, settings))}
    batch = long_batch(length, seed=rank)
    out["logprobs"] = rss.phase(lambda: trainer.forward_logprobs(batch))
    out["step"] = rss.phase(lambda: trainer.train_step(batch, grpo_policy_loss()))
    out["params"] = sum(p.numel() for p in trainer.model.parameters())
    out["share"] = sum(p.to_local().numel() * 4 for p in trainer.model.parameters())
    trainer.shutdown()
    return out


def import_model_code(model_path: str) -> None:
    """Import the model's transformers code (and build nothing), outside the measured phases."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        AutoModelForCausalLM.from_config(config)


def bf16_copy(model_path: str) -> str:
    """The model saved in bf16, as published checkpoints are (an fp32 file would be mapped, not
    copied, by a whole fp32 load)."""
    import torch
    from transformers import AutoModelForCausalLM

    target = Path(model_path + "-bf16")
    if not (target / "config.json").is_file():
        AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).save_pretrained(target)
    return str(target)


def whole_load_rank(rank: int, model_path: str) -> dict:
    """The plain way to load: the whole fp32 model on every rank, then sharded."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    import_model_code(model_path)

    def load():
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)

    return {"load": PeakRss().phase(load)}


def speed_rank(rank: int, model_path: str, attention: str, packing: bool, steps: int) -> dict:
    """Real tokens per second of train steps on a batch whose padding is half its tokens."""
    from strategies.training.losses import grpo_policy_loss

    width, rows = 256, 8
    real = [
        width - (width * 3 // 4) * (r % 2) - (width // 4) * ((r + 1) % 2) for r in range(rows)
    ]  # 3/4 and 1/4 full
    batch = long_batch(width, rows, real, seed=rank)
    changes = (
        {"packing": True, "max_tokens_per_micro_batch": 4 * width} if packing else {"micro_batch_size": 4}
    )
    trainer = trainer_with(model_path, {**changes, "attn_implementation": attention})
    trainer.train_step(batch, grpo_policy_loss())  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(batch, grpo_policy_loss())
    seconds = time.perf_counter() - start
    trainer.shutdown()
    tokens = int(batch.attention_mask.sum())
    return {
        "tokens_per_second": tokens * steps / seconds,
        "padding": 1 - tokens / batch.attention_mask.numel(),
    }


def fill(changes: dict, args) -> dict:
    return {
        k: int(v.format(chunk=args.chunk, length=args.length)) if isinstance(v, str) else v
        for k, v in changes.items()
    }


def main() -> None:
    from roll_device.models.qwen_shaped import make_qwen_shaped_model
    from roll_device.models.tiny import make_tiny_model
    from strategies.training.local_ranks import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.gettempdir()) / "roll-device-train-memory"
    qwen = bf16_copy(str(make_qwen_shaped_model(work / f"qwen-{args.layers}", num_layers=args.layers)))
    tiny = str(make_tiny_model(work / "tiny", num_layers=4, hidden_size=256))
    mib = 2**20
    whole = max(
        r["load"] for r in run_ranks("benchmarks.train_memory:whole_load_rank", 2, qwen, env=ENV, timeout=900)
    )
    say(f"whole load: {whole / mib:.0f} MiB")
    rows = []
    for label, changes in FEATURES:
        ranks = run_ranks(
            "benchmarks.train_memory:memory_rank",
            2,
            qwen,
            fill(changes, args),
            args.length,
            env=ENV,
            timeout=900,
        )
        row = {k: max(r[k] for r in ranks) / mib for k in ("load", "logprobs", "step", "share")}
        rows.append({"label": label, "params": ranks[0]["params"], **row})
        say(f"{label}: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in row.items()))
    speeds = {}
    for attention in ATTENTION:
        for packing in (False, True):
            ranks = run_ranks(
                "benchmarks.train_memory:speed_rank",
                2,
                tiny,
                attention,
                packing,
                args.steps,
                env=ENV,
                timeout=900,
            )
            speeds[attention, packing] = {
                "tokens_per_second": sum(r["tokens_per_second"] for r in ranks),
                "padding": ranks[0]["padding"],
            }
            say(
                f"{attention}, packing={packing}: {speeds[attention, packing]['tokens_per_second']:.0f} tokens/s"
            )
    device = f"{host.processor() or host.machine()}, {os.cpu_count()} cores, CPU (gloo), not simulated"
    plot(rows, whole, speeds)
    replace_section(DOC, "train_memory", render(rows, whole, speeds, args, device))
    say(f"wrote {DOC.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")
    print(f"packed_vs_padded={packed_ratio(speeds, 'sdpa'):.2f}")


def packed_ratio(speeds: dict, attention: str) -> float:
    return speeds[attention, True]["tokens_per_second"] / speeds[attention, False]["tokens_per_second"]


def render(rows: list[dict], whole: float, speeds: dict, args, device: str) -> str:
    base = rows[0]
    share = base["share"]
    lines = [
        "## Training at real sizes (`benchmarks/train_memory.py`)",
        "",
        (
            f"{datetime.date.today()}, {device}. FSDP2 on 2 ranks, one intra-op thread each. Model: "
            f"Qwen2.5-0.5B's shapes with {args.layers} of its 24 decoder layers ({base['params'] / 1e6:.0f}M "
            f"parameters, the 151,936-token vocabulary included), a bf16 checkpoint trained in fp32; one row of {args.length} tokens per "
            f"rank; logprob chunks of {args.chunk} positions. Peak anonymous resident memory (RssAnon) per rank "
            "above the phase's start (the highest rank), MiB."
        ),
        "",
        (
            f"Loading: shard by shard {base['load']:.0f} MiB, whole model then sharded {whole / 2**20:.0f} MiB "
            f"(**{whole / 2**20 / base['load']:.2f}x**); the rank's own fp32 share of the parameters is "
            f"{share:.0f} MiB, so the shard-by-shard load peaks at **{base['load'] / share:.2f}x** the share "
            "(goal: at most 1.3x)."
        ),
        "",
        "| features | load | forward (logprobs) | train step | step vs all off |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['label']} | {row['load']:.0f} | {row['logprobs']:.0f} | {row['step']:.0f} | "
            f"{row['step'] / base['step']:.2f}x |"
        )
    lines += [
        "",
        (
            f"Packed vs padded training, tiny model (4 layers, hidden 256), 8 rows of 256 tokens whose "
            f"padding is {speeds['sdpa', False]['padding']:.0%} of the batch, micro-batches of 1,024 "
            "tokens (4 padded rows, or one packed row); tokens/s count real tokens of both ranks "
            "(goal: packed at least 1.3x padded):"
        ),
        "",
        "| attention | padded tokens/s | packed tokens/s | packed / padded |",
        "|---|---:|---:|---:|",
        *(
            f"| {a} | {speeds[a, False]['tokens_per_second']:.0f} | {speeds[a, True]['tokens_per_second']:.0f} "
            f"| **{packed_ratio(speeds, a):.2f}x** |"
            for a in ATTENTION
        ),
        "",
        PACKING_READING,
        "",
        "Optimizer offload is not in the table: on the CPU its state is in host memory either way.",
        "",
        "![train memory](train_memory_benchmark.png)",
    ]
    return "\n".join(lines)


PACKING_READING = (
    "Packing halves the tokens the linear layers see, but on the CPU no attention kernel is "
    "varlen: the packed row's attention spans the whole row (sdpa with a general block-diagonal "
    "mask, eager with the full score matrix), where padded rows are causal and half as long "
    "(256 vs about 512 tokens), so "
    "the result depends on the kernel. Three timed steps per case on a 2-core machine shared "
    "with other jobs: noisy. A varlen kernel (flash_attention_2 on GPUs) computes only the "
    "diagonal blocks; not measured here."
)


def plot(rows: list[dict], whole: float, speeds: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [r["label"] for r in rows]
    xs = range(len(rows))
    left.bar([x - 0.2 for x in xs], [r["logprobs"] for r in rows], 0.4, label="forward (logprobs)")
    left.bar([x + 0.2 for x in xs], [r["step"] for r in rows], 0.4, label="train step")
    left.set_xticks(list(xs), labels, rotation=20)
    left.set_ylabel("peak MiB per rank")
    left.set_title("Qwen2.5-0.5B shapes, long sequence")
    left.legend()
    right.bar(["load: whole", "load: shards"], [whole / 2**20, rows[0]["load"]], color="tab:gray")
    right.set_ylabel("peak MiB per rank (load)")
    twin = right.twinx()
    names = [f"{a} {'packed' if p else 'padded'}" for a in ATTENTION for p in (False, True)]
    values = [speeds[a, p]["tokens_per_second"] for a in ATTENTION for p in (False, True)]
    twin.bar(names, values, color="tab:green")
    twin.set_ylabel("tokens/s (tiny model)")
    right.tick_params(axis="x", rotation=20)
    right.set_title("loading; packed vs padded tokens/s")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


if __name__ == "__main__":
    main()
