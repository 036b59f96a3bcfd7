"""The rollout/trainer logprob gap of a mixture of experts with and without routing replay (R3), on
the CPU, on the tiny Qwen3-MoE (2 layers, 8 experts, top-2; a random model).

The HF rollout engine samples with routes recorded (`record_routes`), in bfloat16 or float32; the
FSDP2 trainer (fp32, `trainer.routing_replay=true`, one rank in this process) computes the same
tokens' logprobs twice: routing each token itself (the batch without routes) and replaying the
recorded routes; on the weights that sampled them, and again after one optimizer step on the batch
(the drift of a second mini-batch or PPO epoch, where the routers moved too). The gap is the pipeline's `rollout_vs_train_logprob_gap`: the mean absolute
difference of the sampler's and the trainer's logprobs over the response tokens; also its largest
value, and the share of (token, layer) routes on which the trainer's own top-k differs from the
engine's (the flips replay undoes). Each row is the mean over `--seeds` rollouts.

Results replace the routing_replay section of docs/benchmarks.md (with docs/routing_replay_benchmark.png)
and results/routing_replay.json.

    .venv/bin/python benchmarks/routing_replay.py [--prompts 8] [--samples 4] [--tokens 24] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import roll_device as rd
from benchmarks.configs import changed, run_config, trainer_settings
from benchmarks.doc_sections import replace_section
from roll_device.models.tiny import make_tiny_model
from roll_device.pipeline.batching import build_batch
from strategies.base import SamplingConfig
from strategies.inference.hf import HfStrategy
from strategies.training.fsdp import FsdpTrainStrategy
from strategies.training.losses import nll_loss

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "routing_replay_benchmark.png"
RESULTS = ROOT / "results" / "routing_replay.json"
DTYPES = ("bfloat16", "float32")
STEP_LR = 1e-5  # a fine-tuning step: the policy moves little, its routers on near-ties flip
STEPS = {0: "the sampling weights", 1: "one step later"}  # trainer steps since the rollout -> label


def rollout(model: str, dtype: str, prompts: list[list[int]], sampling: SamplingConfig) -> list:
    """Completions of the HF engine in `dtype`, routes recorded."""
    engine = HfStrategy(rd.get_platform("cpu"))
    engine.record_routes()
    engine.initialize(model, changed(run_config("rollout=hf").rollout, "rollout", dtype=dtype))
    completions = engine.generate(prompts, sampling)
    engine.shutdown()
    return completions


def flips(trainer: FsdpTrainStrategy, batch) -> float:
    """The share of recorded (token, layer) routes whose expert set the trainer's own router does
    not choose (the trainer's top-k of its router logits on the same tokens)."""
    from strategies.training.routing import capture

    with torch.no_grad(), capture(trainer.model) as routing:
        trainer.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    _aux, layers = routing.outputs.pop()
    recorded = batch.routed_experts.reshape(-1, *batch.routed_experts.shape[2:])
    differ, total = 0, 0
    for layer, logits in enumerate(layers):
        own = logits.topk(recorded.shape[-1], dim=-1).indices.sort(dim=-1).values
        theirs = recorded[:, layer].long().sort(dim=-1).values
        kept = theirs[:, 0] >= 0
        differ += int((own[kept] != theirs[kept]).any(dim=-1).sum())
        total += int(kept.sum())
    return differ / total


def gaps(trainer: FsdpTrainStrategy, batch, sampler: torch.Tensor) -> dict[str, float]:
    """The gap without replay (the batch's routes left out) and with it, mean and largest."""
    mask = batch.response_mask.bool()
    routes, out = batch.routed_experts, {}
    for label, given in (("free", None), ("replay", routes)):
        batch.routed_experts = given
        diff = (trainer.forward_logprobs(batch) - sampler)[mask].abs()
        out[f"gap_{label}"], out[f"max_{label}"] = diff.mean().item(), diff.max().item()
    batch.routed_experts = routes
    return out


def measure(model: str, dtype: str, args, seed: int) -> dict[int, dict[str, float]]:
    """One rollout's gaps and flips with the weights that sampled it (0) and after one step (1)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, 40, (args.prompts, 6), generator=g).tolist()
    sampling = SamplingConfig(n=args.samples, max_tokens=args.tokens, temperature=1.0, seed=seed)
    completions = rollout(model, dtype, prompts, sampling)
    batch, sampler = build_batch(prompts, completions, pad_id=0)
    trainer = FsdpTrainStrategy(rd.get_platform("cpu"))
    trainer.initialize(
        model, trainer_settings("fsdp", routing_replay=True, mixed_precision="fp32", lr=STEP_LR)
    )
    out = {0: {**gaps(trainer, batch, sampler), "flips": flips(trainer, batch)}}
    trainer.train_step(batch, nll_loss())
    out[1] = {**gaps(trainer, batch, sampler), "flips": flips(trainer, batch)}
    trainer.shutdown()
    return out


def table(rows: dict[str, dict[str, float]], args) -> str:
    head = (
        f"2026-11-28, x86_64, 2 cores, CPU, not simulated. Tiny Qwen3-MoE (2 layers, 8 experts, top-2, "
        f"random weights); HF engine rollouts of {args.prompts} prompts x {args.samples} samples x "
        f"{args.tokens} tokens at temperature 1; FSDP2 trainer in fp32 on one rank, on the weights that sampled "
        f"the tokens and after one step on them (lr {STEP_LR}, replay on). Gap: mean |sampler - "
        f"trainer| logprob over response tokens (the run record's `rollout_vs_train_logprob_gap`), mean of "
        f"{args.seeds} rollouts; flips: the share of recorded (token, layer) routes the trainer's own router "
        "does not choose. Replay takes out the part of the gap that flipped routes cause (its largest "
        "values); the rest is the precision's and the update's."
    )
    lines = [
        (
            "| rollout dtype | trainer | route flips | gap without replay | gap with replay | largest without "
            "| largest with |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        dtype, _, trainer = label.partition(", ")
        lines.append(
            f"| {dtype} | {trainer} | {r['flips']:.1%} | {r['gap_free']:.4f} | {r['gap_replay']:.4f} | "
            f"{r['max_free']:.3f} | {r['max_replay']:.3f} |"
        )
    return "\n".join(
        [
            "## Routing replay: the rollout/trainer logprob gap",
            "",
            head,
            "",
            *lines,
            "",
            f"![gap]({PLOT.name})",
        ]
    )


def plot(rows: dict[str, dict[str, float]]) -> None:
    """The mean and the largest gap per condition, without and with replay, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    x = range(len(rows))
    for ax, (stat, title) in zip(axes, (("gap", "mean |logprob gap|"), ("max", "largest |logprob gap|"))):
        ax.bar([i - 0.2 for i in x], [r[f"{stat}_free"] for r in rows.values()], 0.4, label="without replay")
        ax.bar([i + 0.2 for i in x], [r[f"{stat}_replay"] for r in rows.values()], 0.4, label="with replay")
        ax.set_xticks(list(x), [label.replace(", ", "\n") for label in rows], fontsize=7)
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle("tiny Qwen3-MoE, CPU: HF rollout vs FSDP2 trainer (fp32)", fontsize=10)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = str(make_tiny_model(Path(folder) / "tiny-qwen3-moe", architecture="qwen3_moe"))
        rows = {}
        for dtype in DTYPES:
            runs = [measure(model, dtype, args, seed) for seed in range(args.seeds)]
            for steps, trainer in STEPS.items():
                label = f"{dtype}, {trainer}"
                rows[label] = {
                    key: statistics.mean(run[steps][key] for run in runs) for key in runs[0][steps]
                }
                print(label, rows[label], flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1) + "\n")
    plot(rows)
    replace_section(DOC, "routing_replay", table(rows, args))


if __name__ == "__main__":
    main()
