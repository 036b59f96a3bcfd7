"""Weight sync of a LoRA policy against full-parameter training, measured in one run on the CPU at
the shapes of Qwen2.5-0.5B (a random model, `roll_device/models/qwen_shaped.py`).

Both trainers are the FSDP2 strategy on one rank (full: every parameter; LoRA: `trainer.lora` of
rank `--rank` on every linear layer); the engine is the HF rollout strategy (bfloat16, as the
pipeline's export casts), fed by a real `WeightSender` / `WeightReceiver` pair over host shared
memory (the same-host bridge) in this process, with verification on. A full sync sends every
tensor; a LoRA run's every sync the adapters alone (the engine loaded the frozen base from the
checkpoint), which the engine merges into its weights. Rounds alternate full and LoRA syncs, so both see
the same machine load; medians are reported, with each side's bytes and the LoRA/full ratios.
Then each trainer's step time (alternating rounds again) and what training holds beyond the
model: trainable parameters and Adam's state.

Results replace the lora_sync section of docs/benchmarks.md (and results/lora_sync.json).

    .venv/bin/python benchmarks/lora_sync.py [--layers 24] [--rank 8] [--rounds 5] [--step-rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import roll_device as rd
from benchmarks.configs import changed, run_config, trainer_settings
from benchmarks.doc_sections import replace_section
from roll_device.comm import WeightReceiver, WeightSender, plan_sync
from roll_device.models.qwen_shaped import make_qwen_shaped_model
from strategies.base import TrainBatch
from strategies.inference.hf import HfStrategy
from strategies.training.fsdp import FsdpTrainStrategy
from strategies.training.losses import nll_loss

ENGINE_DTYPE = torch.bfloat16
STEP_ROWS, STEP_TOKENS = 4, 64  # the train step timed per round


class Pair:
    """A trainer, an engine fed by it, and the connected sender and receiver between them."""

    def __init__(self, model: str, lora: dict | None) -> None:
        cpu = rd.get_platform("cpu")
        settings = trainer_settings("fsdp", **({"lora": lora} if lora else {}))
        self.trainer = FsdpTrainStrategy(cpu)
        self.trainer.initialize(model, settings)
        self.engine = HfStrategy(cpu)
        if lora:
            self.engine.use_adapters(settings.lora)
        rollout = changed(run_config("rollout=hf").rollout, "rollout", dtype="bfloat16", use_graphs=False)
        self.engine.initialize(model, rollout)
        plan = plan_sync(cpu, cpu, colocated=False, same_node=True, forced="bridge")
        options = changed(run_config().weight_sync, "weight_sync", verify=True)
        self.sender = WeightSender(plan, cpu, 1, options)
        self.receiver = WeightReceiver(self.sender.endpoint, 1, cpu)
        _together(self.sender.connect, self.receiver.connect)
        self.version = 0

    def sync(self) -> dict:
        """One sync (a LoRA trainer's: the adapters alone): its bytes and seconds."""
        self.version += 1
        self.merge_s = 0.0
        export = self.trainer.export_adapters if self.trainer.lora else self.trainer.export_weights
        named = export(dtype=ENGINE_DTYPE, snapshot=False, to_rank=0)
        start = time.perf_counter()
        stats = _together(
            lambda: self.sender.send(named, self.version),
            lambda: self.receiver.receive(self.engine.update_weights),
        )
        seconds = time.perf_counter() - start
        return {"bytes": stats.nbytes, "tensors": stats.tensors, "seconds": seconds, "merge_s": self.merge_s}

    def time_merges(self) -> None:
        """Time, inside each sync, the engine's merge of the adapters into its weights."""
        merge = self.engine.merged.merge

        def timed(weights) -> None:
            start = time.perf_counter()
            merge(weights)
            self.merge_s = time.perf_counter() - start

        self.engine.merged.merge = timed

    def step(self) -> float:
        """Seconds of one train step (the NLL of a fixed batch of STEP_ROWS x STEP_TOKENS)."""
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, 1000, (STEP_ROWS, STEP_TOKENS), generator=generator)
        response = torch.ones(STEP_ROWS, STEP_TOKENS)
        response[:, : STEP_TOKENS // 4] = 0
        batch = TrainBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=response)
        start = time.perf_counter()
        self.trainer.train_step(batch, nll_loss())
        return time.perf_counter() - start

    def training_state(self) -> dict:
        """What training holds beyond the model: trainable parameters and Adam's state bytes."""
        trainable = [p for p in self.trainer.model.parameters() if p.requires_grad]
        state = self.trainer.optimizer.state.values()
        adam = sum(v.numel() * v.element_size() for s in state for v in s.values() if v.dim() > 0)
        return {"trainable": sum(p.numel() for p in trainable), "adam_bytes": adam}

    def close(self) -> None:
        _together(self.sender.close, self.receiver.close)
        self.engine.shutdown()
        self.trainer.shutdown()


def _together(background, foreground):
    thread = threading.Thread(target=background)
    thread.start()
    try:
        return foreground()
    finally:
        thread.join()


def measure(model: str, rank: int, rounds: int, step_rounds: int) -> dict:
    """Syncs of `rounds` alternating rounds, then train steps of `step_rounds`; medians."""
    lora = {"rank": rank, "alpha": 2.0 * rank, "dropout": 0.0, "target_modules": "all-linear"}
    pairs = {"full": Pair(model, None), "lora": Pair(model, lora)}
    try:
        pairs["lora"].time_merges()
        runs = {side: [] for side in pairs}
        for _ in range(rounds):
            for side, pair in pairs.items():
                runs[side].append(pair.sync())
        steps = {side: [] for side in pairs}
        for _ in range(step_rounds):
            for side, pair in pairs.items():
                steps[side].append(pair.step())
        result = {
            side: {
                **{k: statistics.median(r[k] for r in runs[side]) for k in ("bytes", "seconds", "merge_s")},
                "step_s": statistics.median(steps[side]),
                **pair.training_state(),
            }
            for side, pair in pairs.items()
        }
    finally:
        for pair in pairs.values():
            pair.close()
    share = statistics.median(r["merge_s"] / r["seconds"] for r in runs["lora"])
    return {
        "rank": rank,
        "rounds": rounds,
        "step_rounds": step_rounds,
        **result,
        "merge_share": share,
    }


def section(result: dict, layers: int) -> str:
    full, lora = result["full"], result["lora"]
    rows = [
        ("full parameters, every sync", full),
        (f"LoRA rank {result['rank']}, every sync (adapters)", lora),
    ]
    table = "\n".join(f"| {name} | {r['bytes'] / 2**20:,.2f} | {r['seconds']:.3f} |" for name, r in rows)
    return f"""## LoRA weight sync (`benchmarks/lora_sync.py`) - CPU only
Qwen2.5-0.5B shapes ({layers} layers, random weights), FSDP2 trainer (one rank) to the HF engine
(bfloat16) over the same-host bridge (shared memory), verification on, in one process on this
machine's CPU; medians of {result["rounds"]} alternating rounds. A LoRA sync's seconds include the
engine merging the adapters into its weights.

| sync | MiB | seconds |
|---|---|---|
{table}

LoRA / full: bytes x{lora["bytes"] / full["bytes"]:.4f}, seconds x{lora["seconds"] / full["seconds"]:.3f}.
Inside a LoRA sync, the HF engine's merge of the adapters into its linear weights (one `addmm`
pass over each, in bfloat16) takes {lora["merge_s"]:.3f} s (median), {result["merge_share"]:.0%} of the
sync (median share): the adapters are under 1% of the model's bytes, but the merge touches every
adapted weight. vLLM applies adapters at run time (Punica kernels) and merges nothing. This
machine's two cores are shared with other work: seconds vary from run to run; the ratios come
from alternating rounds of one run.

| trainer | trainable parameters | Adam state MiB | step seconds ({STEP_ROWS} x {STEP_TOKENS} tokens, median of {result["step_rounds"]}) |
|---|---|---|---|
| full parameters | {full["trainable"]:,} | {full["adam_bytes"] / 2**20:,.1f} | {full["step_s"]:.2f} |
| LoRA rank {result["rank"]} | {lora["trainable"]:,} | {lora["adam_bytes"] / 2**20:,.1f} | {lora["step_s"]:.2f} |

Step time LoRA / full: x{lora["step_s"] / full["step_s"]:.2f} (fp32 on the CPU, one rank; the frozen
base still runs its forward and the backward through it). Peak memory per rank on an accelerator is
not measured here (no device in this session).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--step-rounds", type=int, default=2)
    parser.add_argument("--model-dir", default=str(Path.home() / ".cache" / "roll-device" / "qwen05b-shaped"))
    args = parser.parse_args()
    model = str(make_qwen_shaped_model(args.model_dir, num_layers=args.layers, tokenizer=True))
    result = measure(model, args.rank, args.rounds, args.step_rounds)
    (ROOT / "results").mkdir(exist_ok=True)
    (ROOT / "results" / "lora_sync.json").write_text(json.dumps({**result, "layers": args.layers}, indent=2))
    replace_section(ROOT / "docs" / "benchmarks.md", "lora_sync", section(result, args.layers))
    print(f"lora_vs_full_bytes={result['lora']['bytes'] / result['full']['bytes']:.4f}")
    print(f"lora_vs_full_seconds={result['lora']['seconds'] / result['full']['seconds']:.3f}")


if __name__ == "__main__":
    main()
