"""The GPU columns of the benchmarks, measured in one run on a CUDA or ROCm GPU (nothing simulated):

1. HF strategy decode graphs vs eager, at batch 1, 2, 4, 8 and 16, for the tiny local model (fp32)
   and a randomly initialised model with Qwen2.5-0.5B's shapes (bf16): the decode step alone
   (`runner.run`, one token for every row) and whole greedy generations (tokens/s, sampling and
   the host loop included). Greedy tokens with graphs must equal eager ones, or the run fails.
2. Colocated weight sync through CUDA IPC handles between this process and a receiver process on
   the same GPU, against a device-to-device copy of the same tensors in one process, on a state
   dict with Qwen2.5-0.5B's shapes in bf16; the receiver's weights must hash equal to the export.

Baseline and subject alternate round by round; medians are reported. Results replace the `gpu`
section of docs/benchmarks.md (device, torch build and date named), the plot is
docs/gpu_benchmark.png, and `--results FILE` also gets them as JSON. The last lines printed are
one `check <name>: <value>` summary line per measurement.

    python benchmarks/gpu.py [--rounds 5] [--max-tokens 64] [--results runs/gpu-check/gpu-benchmark.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn.attention import sdpa_kernel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import roll_device as rd
from benchmarks.doc_sections import replace_section
from benchmarks.weight_sync_receiver import make_state, qwen_shapes
from strategies.inference.hf import DECODE_ATTENTION

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "gpu_benchmark.png"
BATCHES = (1, 2, 4, 8, 16)
PROMPT_LENGTH = 16
GRAPH_GOAL = 2.0
# Largest difference of one decode step's logprobs, graphs vs eager, accepted in bf16 (kernels
# chosen under capture may round differently); fp32 must give the same tokens.
STEP_TOLERANCE = 0.05


def say(message: str) -> None:
    print(f"[gpu-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def timed(platform, fn, repeat: int = 1) -> float:
    """Seconds per call of `fn`, the device drained before and after."""
    platform.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    platform.synchronize()
    return (time.perf_counter() - start) / repeat


# ---- decode graphs ------------------------------------------------------------------------------
def start_hf(platform, model_path: str, dtype: str, use_graphs: bool):
    from roll_device.commands.gate import load_config
    from strategies.registry import strategy_class

    overrides = [f"max_batch_size={max(BATCHES)}", f"use_graphs={str(use_graphs).lower()}", f"dtype={dtype}"]
    config = load_config(["rollout=hf", *(f"rollout.{o}" for o in overrides)])
    strategy = strategy_class("inference", "hf", platform.kind)(platform)
    strategy.initialize(model_path, config.rollout)
    return strategy


def prompts(rows: int, vocab: int) -> list[list[int]]:
    return [[3 + (7 * i + 3 * j) % min(vocab - 3, 40) for j in range(PROMPT_LENGTH)] for i in range(rows)]


def decode_step_inputs(strategy, rows: int) -> dict[str, torch.Tensor]:
    """Inputs of one decode step for `rows` rows after a prompt of PROMPT_LENGTH tokens, with the
    bucket's cache positioned there (what `generate` hands the runner on its first step)."""
    from strategies.inference.hf_cache import set_length

    device = strategy.platform.device()
    set_length(strategy.bucket_caches[strategy.runner.bucket(rows)], PROMPT_LENGTH)
    mask = torch.zeros(rows, 1, 1, strategy.store.max_len, dtype=torch.bool, device=device)
    mask[..., : PROMPT_LENGTH + 1] = True
    return {
        "tokens": torch.full((rows, 1), 5, dtype=torch.long, device=device),
        "positions": torch.full((rows, 1), PROMPT_LENGTH, dtype=torch.long, device=device),
        "mask": mask,
    }


def first_divergence(a: list[list[int]], b: list[list[int]]) -> int | None:
    """The first generated position at which any row of `a` and `b` differ (None: identical)."""
    positions = [
        next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), min(len(ra), len(rb)))
        for ra, rb in zip(a, b)
        if ra != rb
    ]
    return min(positions) if positions else None


def decode_model(platform, label: str, model_path: str, dtype: str, args) -> dict:
    """Step and generation timings of one model, graphs and eager alternating per round."""
    from strategies.base import SamplingConfig

    modes = {
        True: start_hf(platform, model_path, dtype, True),
        False: start_hf(platform, model_path, dtype, False),
    }
    sampling = SamplingConfig(n=1, max_tokens=args.max_tokens, temperature=0.0)
    rows_out = []
    try:
        vocab = modes[True].vocab_size
        for rows in BATCHES:
            batch = prompts(rows, vocab)
            tokens = {
                g: [c.token_ids for c in s.generate(batch, sampling)] for g, s in modes.items()
            }  # warm-up
            count = sum(map(len, tokens[True]))
            inputs = {g: decode_step_inputs(s, rows) for g, s in modes.items()}
            with torch.no_grad(), sdpa_kernel(DECODE_ATTENTION):  # one step, same prompt cache, both ways
                step_diff = (
                    modes[True].runner.run(inputs[True]) - modes[False].runner.run(inputs[False])
                ).abs()
            step_diff = float(step_diff.max())
            if tokens[True] != tokens[False] and (dtype == "float32" or step_diff > STEP_TOLERANCE):
                raise SystemExit(
                    f"{label}, batch {rows}: greedy tokens with graphs differ from eager (largest "
                    f"difference of one step's logprobs: {step_diff:.3g})"
                )
            step = {True: [], False: []}
            gen = {True: [], False: []}
            for _ in range(args.rounds):
                for g, s in modes.items():
                    with torch.no_grad(), sdpa_kernel(DECODE_ATTENTION):  # the kernels generate uses
                        step[g].append(
                            timed(platform, lambda s=s, x=inputs[g]: s.runner.run(x), repeat=args.steps)
                        )
                    gen[g].append(count / timed(platform, lambda s=s, b=batch: s.generate(b, sampling)))
            result = {
                "rows": rows,
                "tokens": count,
                "tokens_equal": tokens[True] == tokens[False],
                "first_divergence": first_divergence(tokens[True], tokens[False]),
                "step_logprob_diff": step_diff,
                "step_ms_graphs": 1e3 * statistics.median(step[True]),
                "step_ms_eager": 1e3 * statistics.median(step[False]),
                "tok_s_graphs": statistics.median(gen[True]),
                "tok_s_eager": statistics.median(gen[False]),
            }
            result["step_speedup"] = result["step_ms_eager"] / result["step_ms_graphs"]
            result["generate_speedup"] = result["tok_s_graphs"] / result["tok_s_eager"]
            say(
                f"  {label} batch {rows}: step {result['step_ms_eager']:.2f} -> {result['step_ms_graphs']:.2f} ms "
                f"(x{result['step_speedup']:.2f}), generate x{result['generate_speedup']:.2f}"
            )
            rows_out.append(result)
    finally:
        for strategy in modes.values():
            strategy.shutdown()
    return {"label": label, "dtype": dtype, "batches": rows_out}


def measure_decode(platform, args) -> list[dict]:
    from roll_device.models.qwen_shaped import make_qwen_shaped_model
    from roll_device.models.tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as scratch:
        tiny = str(make_tiny_model(Path(scratch) / "tiny"))
        say("decode graphs vs eager: tiny model")
        results = [decode_model(platform, "tiny Qwen2 (2 layers, hidden 128)", tiny, "float32", args)]
        say("decode graphs vs eager: Qwen2.5-0.5B shapes (random weights)")
        shaped = str(make_qwen_shaped_model(Path(scratch) / "qwen-shaped"))
        results.append(
            decode_model(platform, "Qwen2.5-0.5B shapes (24 layers, random)", shaped, "bfloat16", args)
        )
    return results


# ---- colocated weight sync through IPC ------------------------------------------------------------
def receiver_main(conn, shapes) -> None:
    """The rollout end on the same GPU: preallocated parameters, one WeightReceiver."""
    from roll_device.comm import WeightReceiver, weights_hash

    platform = rd.current_platform()
    params = {k: v.to(platform.device()) for k, v in make_state(shapes, torch.bfloat16, fill=False).items()}
    receiver = None

    def apply(named):
        for name, tensor in named:
            params[name].copy_(tensor)

    while True:
        command, arg = conn.recv()
        answer = None
        if command == "close":
            receiver.close()
            conn.send(None)
            return
        if command == "connect":
            receiver = WeightReceiver(arg, 1, platform, timeout_s=120)
            receiver.connect()
        elif command == "receive":
            answer = receiver.receive(apply).seconds
        elif command == "hash":
            answer = weights_hash(params.items())
        elif command == "zero":
            for tensor in params.values():
                tensor.zero_()
        conn.send(answer)


class IpcPair:
    """This process's colocated sender and a receiver process on the same GPU, connected; the
    receiver answers (command, arg) messages (`ask` returns the call that waits for the answer)."""

    def __init__(self, platform, shapes) -> None:
        from roll_device.comm import WeightSender, plan_sync
        from roll_device.commands.gate import load_config

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=receiver_main, args=(child, shapes))
        self.process.start()
        self.plan = plan_sync(
            platform.kind, platform.kind, colocated=True, same_node=True, forced="colocated"
        )
        self.sender = WeightSender(self.plan, platform, 1, load_config([]).weight_sync)  # configured defaults
        answer = self.ask("connect", self.sender.endpoint)
        self.sender.connect()
        answer()

    def ask(self, command, arg=None):
        self.conn.send((command, arg))
        return self.conn.recv

    def sync(self, state, version: int) -> float:
        """Seconds of one sync of `state`, until the receiver has applied it."""
        answer = self.ask("receive")
        start = time.perf_counter()
        self.sender.send(state.items(), version=version)
        answer()
        return time.perf_counter() - start

    def close(self) -> None:
        closed = self.ask("close")
        self.sender.close()
        closed()
        self.process.join(timeout=60)


def measure_ipc(platform, args) -> dict:
    from roll_device.comm import weights_hash

    shapes = qwen_shapes(24)
    state = {k: v.to(platform.device()) for k, v in make_state(shapes, torch.bfloat16, fill=True).items()}
    targets = {k: torch.empty_like(v) for k, v in state.items()}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    pair = IpcPair(platform, shapes)

    def copy():
        for name, tensor in state.items():
            targets[name].copy_(tensor)

    say(f"colocated IPC sync vs device copy, {nbytes / 1e9:.2f} GB")
    times = []
    try:
        for round_ in range(args.rounds + 1):
            copy_s = timed(platform, copy)
            sync_s = pair.sync(state, round_ + 1)
            if round_:
                times.append((sync_s, copy_s))
                say(f"  round {round_}: sync {sync_s * 1e3:.1f} ms, copy {copy_s * 1e3:.1f} ms")
        pair.ask("zero")()
        pair.sync(state, args.rounds + 2)
        hash_equal = pair.ask("hash")() == weights_hash(state.items())
    finally:
        pair.close()
    if not hash_equal:
        raise SystemExit("colocated IPC sync: the receiver's weights differ from the export")
    sync_s = statistics.median(t for t, _ in times)
    copy_s = statistics.median(c for _, c in times)
    return {
        "plan": pair.plan.describe(),
        "bytes": nbytes,
        "sync_gbps": nbytes / sync_s / 1e9,
        "copy_gbps": nbytes / copy_s / 1e9,
        "ratio": statistics.median(c / t for t, c in times),
        "hash_equal": hash_equal,
    }


# ---- report -------------------------------------------------------------------------------------
def render(r: dict) -> str:
    lines = [
        "## GPU (`benchmarks/gpu.py`, run by `scripts/gpu-check.sh`)",
        "",
        (
            f"Run {r['when']} on **{r['device']}** ({r['memory_gib']:.0f} GiB), torch {r['torch']} "
            f"(CUDA {r['cuda']}); nothing simulated. Median of {r['rounds']} rounds; graphs and eager "
            "alternate within each round. vLLM was not run on the GPU: the GPU machine has no vLLM "
            "(its CUDA wheel is too large to bring there)."
        ),
        "",
        (
            "**HF strategy decode graphs vs eager.** Step: one decode step for every row "
            f"(`runner.run`, {r['steps']} steps per timing); generate: greedy generation of "
            f"{r['max_tokens']} tokens after a {PROMPT_LENGTH}-token prompt, sampling and the host loop "
            "included. Same tokens: whether greedy tokens with graphs equal eager ones (else the first "
            "position where a row differs); step diff: the largest difference of one decode step's "
            "logprobs, replayed vs eager, on the same prompt cache. "
            f"Goal: decode step at least {GRAPH_GOAL:.0f}x faster at batch 1-16."
        ),
        "",
        (
            "| model | batch | eager step ms | graph step ms | step speed-up | eager tok/s | graph tok/s "
            "| generate speed-up | same tokens | step diff |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for model in r["decode"]:
        for b in model["batches"]:
            same = "yes" if b["tokens_equal"] else f"to token {b['first_divergence']}"
            lines.append(
                f"| {model['label']}, {model['dtype']} | {b['rows']} | {b['step_ms_eager']:.2f} | "
                f"{b['step_ms_graphs']:.2f} | **{b['step_speedup']:.1f}x** | {b['tok_s_eager']:,.0f} | "
                f"{b['tok_s_graphs']:,.0f} | {b['generate_speedup']:.1f}x | {same} | {b['step_logprob_diff']:.2g} |"
            )
    ipc = r["ipc"]
    lines += [
        "",
        (
            f"**Colocated weight sync through CUDA IPC** (`{ipc['plan']}`), trainer in this process, "
            f"receiver in another process on the same GPU, a state dict with Qwen2.5-0.5B's shapes in "
            f"bf16 ({ipc['bytes'] / 1e9:.2f} GB, 64 MiB buckets): **{ipc['sync_gbps']:.1f} GB/s** against "
            f"a device-to-device copy of the same tensors in one process at {ipc['copy_gbps']:.1f} GB/s: "
            f"ratio **{ipc['ratio']:.2f}**. The receiver's weights hash equal to the export."
        ),
        "",
        f"![GPU benchmark]({PLOT.relative_to(DOC.parent)})",
    ]
    return "\n".join(lines)


def plot(r: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(r["decode"]) + 1, figsize=(5 * (len(r["decode"]) + 1), 4))
    for ax, model in zip(axes, r["decode"]):
        x = [b["rows"] for b in model["batches"]]
        ax.plot(x, [b["step_speedup"] for b in model["batches"]], "o-", label="decode step")
        ax.plot(x, [b["generate_speedup"] for b in model["batches"]], "s-", label="whole generation")
        ax.axhline(GRAPH_GOAL, color="#999999", linestyle="--", label=f"goal {GRAPH_GOAL:.0f}x")
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(v) for v in x])
        ax.set_xlabel("batch")
        ax.set_ylabel("graphs / eager")
        ax.set_title(model["label"], fontsize=9)
        ax.legend(fontsize=8)
    ipc = r["ipc"]
    axes[-1].bar(
        ["device copy", "IPC sync"], [ipc["copy_gbps"], ipc["sync_gbps"]], color=["#888888", "#3b75af"]
    )
    axes[-1].set_ylabel("GB/s")
    axes[-1].set_title(f"colocated sync, {ipc['bytes'] / 1e9:.2f} GB: ratio {ipc['ratio']:.2f}", fontsize=9)
    fig.suptitle(f"{r['device']}, torch {r['torch']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


def summary(r: dict) -> list[str]:
    lines = []
    for model in r["decode"]:
        speedups = [b["step_speedup"] for b in model["batches"]]
        worst = min(speedups)
        verdict = "meets" if worst >= GRAPH_GOAL else "below"
        differ = [b["rows"] for b in model["batches"] if not b["tokens_equal"]]
        same = (
            f"greedy tokens differ from eager at batch {differ}" if differ else "greedy tokens equal to eager"
        )
        diff = max(b["step_logprob_diff"] for b in model["batches"])
        lines.append(
            f"check decode graphs, {model['label']}: step speed-up {worst:.1f}x to {max(speedups):.1f}x "
            f"at batch 1-16 ({verdict} the {GRAPH_GOAL:.0f}x goal); {same}; step diff {diff:.2g}"
        )
    ipc = r["ipc"]
    lines.append(
        f"check colocated IPC sync: {ipc['sync_gbps']:.1f} GB/s vs device copy {ipc['copy_gbps']:.1f} GB/s "
        f"(ratio {ipc['ratio']:.2f}); hash equal"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50, help="decode steps per step timing")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--results", type=Path, default=None, help="also write the results here as JSON")
    args = parser.parse_args()
    platform = rd.current_platform()
    if not platform.supports_graphs or not platform.supports_ipc:
        raise SystemExit(
            f"benchmarks/gpu.py needs a CUDA or ROCm GPU; this process's platform is {platform.name}"
        )
    results = {
        "when": datetime.date.today().isoformat(),
        "device": platform.device_name(0),
        "memory_gib": platform.total_memory(0) / 2**30,
        "torch": torch.__version__,
        "cuda": torch.version.cuda or torch.version.hip,
        "rounds": args.rounds,
        "steps": args.steps,
        "max_tokens": args.max_tokens,
    }
    results["decode"] = measure_decode(platform, args)
    results["ipc"] = measure_ipc(platform, args)
    replace_section(DOC, "gpu", render(results))
    plot(results)
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(results, indent=2))
    for line in summary(results):
        print(line, flush=True)


if __name__ == "__main__":
    main()
