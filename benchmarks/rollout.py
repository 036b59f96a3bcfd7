"""Rollout throughput, measured in one run on this machine's platform:

1. the vLLM strategy against calling `vllm.LLM.generate` directly on the same engine, prompts
   and per-request sampling settings (the strategy's overhead; its ratio must be >= 0.98);
2. the HF strategy with decode graphs against eager at batch 1, 4 and 16 (graphs where the
   platform has them; eager only elsewhere, said so in the results);
3. the HF strategy's prefill: prompt tokens per second of a prefill alone (`max_tokens=1`) eager
   and with piecewise prefill graphs (`prefill_graphs: true`), and generated tokens per second with
   decode and prefill graphs together (graph platforms only; on the simulated NPU the numbers are
   simulations and say nothing about a device, which the results say);
4. the HF strategy against the vLLM strategy at the same batches, so users know when to use which.

Results replace the rollout section of docs/benchmarks.md and a plot is written to
docs/rollout_benchmark.png. The last line printed is `vllm_strategy_vs_raw=<ratio>`.

    .venv/bin/python benchmarks/rollout.py [--rounds 5] [--ratio-rounds 21] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as host
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "rollout_benchmark.png"
BATCHES = (1, 4, 16)
RESULT = "ROLLOUT-BENCH-RESULT "
SEED = 1234
# the settings each part process is started with, and the results name
PART_ARGS = ("rounds", "ratio_rounds", "max_tokens", "prompt_length", "raw_batch", "layers", "hidden")


def say(message: str) -> None:
    print(f"[rollout-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    return [[3 + (7 * i + 3 * j) % (vocab - 3) for j in range(length)] for i in range(count)]


def tokens_per_second(fn) -> float:
    """Generated tokens per second of one call of `fn`, which returns how many it generated."""
    start = time.perf_counter()
    tokens = fn()
    return tokens / (time.perf_counter() - start)


def strategy_vs_raw(strategy, batch: list[list[int]], max_tokens: int, rounds: int) -> dict:
    """Same engine, same prompts, same per-request settings (vLLM's SamplingParams written out
    here). Each round times both, in alternating order; the ratio is the median of the rounds'
    ratios, which a burst of other work on the machine moves least."""
    from vllm import SamplingParams

    from strategies.base import SamplingConfig

    sampling = SamplingConfig(n=1, max_tokens=max_tokens, temperature=1.0, seed=SEED)
    raw_prompts = [{"prompt_token_ids": p} for p in batch]
    raw_params = [
        SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=SEED + i, logprobs=0, detokenize=False)
        for i in range(len(batch))
    ]

    def raw() -> int:
        outputs = strategy.llm.generate(raw_prompts, raw_params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    def wrapped() -> int:
        return sum(len(c.token_ids) for c in strategy.generate(batch, sampling))

    assert raw() == wrapped(), "the strategy and the raw engine generated different token counts"
    raw_runs, wrapped_runs = [], []
    for r in range(rounds):
        if r % 2:
            wrapped_runs.append(tokens_per_second(wrapped))
            raw_runs.append(tokens_per_second(raw))
        else:
            raw_runs.append(tokens_per_second(raw))
            wrapped_runs.append(tokens_per_second(wrapped))
        say(f"  round {r + 1}/{rounds}: raw {raw_runs[-1]:,.0f}, strategy {wrapped_runs[-1]:,.0f} tok/s")
    ratios = sorted(w / r for w, r in zip(wrapped_runs, raw_runs, strict=True))
    middle = len(ratios) // 2
    median = ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2
    return {"raw": max(raw_runs), "strategy": max(wrapped_runs), "ratio": median}


def per_batch(
    strategy, vocab: int, prompt_length: int, max_tokens: int, rounds: int, prefill: bool = False
) -> dict[int, float]:
    """Best generated tokens/s per batch; with `prefill`, prompt tokens/s of calls that generate
    one token each (the prefill and one sampling step)."""
    from strategies.base import SamplingConfig

    sampling = SamplingConfig(n=1, max_tokens=1 if prefill else max_tokens, temperature=1.0, seed=SEED)
    result = {}
    for batch in BATCHES:
        rows = prompts(batch, prompt_length, vocab)
        strategy.generate(rows, sampling)  # warm-up

        def call(rows=rows) -> int:
            completions = strategy.generate(rows, sampling)
            return sum(map(len, rows)) if prefill else sum(len(c.token_ids) for c in completions)

        result[batch] = max(tokens_per_second(call) for _ in range(rounds))
        say(f"  batch {batch}: {result[batch]:,.0f} {'prompt ' if prefill else ''}tok/s")
    return result


def start(name: str, platform, model_path: str, *overrides: str):
    from roll_device.commands.gate import load_config
    from strategies.registry import strategy_class

    config = load_config([f"rollout={name}", *(f"rollout.{o}" for o in overrides)])
    strategy = strategy_class("inference", name, platform.kind)(platform)
    strategy.initialize(model_path, config.rollout)
    return strategy


def write_results(results: dict) -> None:
    replace_section(DOC, "rollout", render(results))
    plot(results)


def render_prefill(r: dict) -> list[str]:
    """The prefill section: eager against piecewise prefill graphs, or why it is absent."""
    both = r["hf_prefill_graphs"]
    if not both:
        return [
            (
                f"**Prefill graphs**: not measured: no device graphs on `{r['device']}` "
                "(`rollout.prefill_graphs: true` is refused there). Run the script on a GPU or NPU."
            ),
            "",
        ]
    lines = [
        (
            f"**Prefill graphs** (`rollout.prefill_graphs: true`; {r['prompt_length']}-token prompts, so "
            f"batch b prefills {r['prompt_length']} b tokens in one token-count bucket): prompt tokens/s "
            "of a prefill alone (one generated token) with the eager prefill and with prefill graphs, and "
            "generated tokens/s with decode and prefill graphs against decode graphs only."
        ),
        "",
        (
            "| batch | prefill eager tok/s | prefill graphs tok/s | prefill graphs / eager "
            "| decode+prefill graphs tok/s | / decode graphs only |"
        ),
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for b in BATCHES:
        eager, graphs = r["hf_graphs_prefill"][b], both["prefill"][b]
        decode_only = r["hf_graphs"][b]
        lines.append(
            f"| {b} | {eager:,.0f} | {graphs:,.0f} | {graphs / eager:.2f} | {both['generate'][b]:,.0f} "
            f"| {both['generate'][b] / decode_only:.2f} |"
        )
    lines.append("")
    if r["simulated"]:
        lines += [
            (
                f"`{r['device']}` is a SIMULATION (CPU compute behind `npu` tensors; replay reruns "
                "recorded ops): these timings say nothing about a device."
            ),
            "",
        ]
    return lines


def render(r: dict) -> str:
    graphs = r["hf_graphs"]
    lines = [
        "## Rollout strategies (`benchmarks/rollout.py`)",
        "",
        (
            f"Run {r['when']} on `{r['device']}` ({r['host']}); model: the tiny local Qwen2 "
            f"({r['layers']} layers, hidden {r['hidden']}), prompts of {r['prompt_length']} tokens, "
            f"{r['max_tokens']} new tokens each, temperature 1.0; per batch the best of {r['rounds']} "
            "rounds. Throughput counts generated tokens only. The machine is shared: its 1-minute load "
            "average "
            f"was {r['load']:.1f} before and {r['load_after']:.1f} after the run, so absolute numbers "
            "carry noise; the strategy-vs-raw ratio pairs calls on one engine so that both share it."
        ),
        "",
        (
            f"**vLLM strategy vs `vllm.LLM.generate` on the same engine** ({r['raw_batch']} prompts): "
            f"best raw {r['vs_raw']['raw']:,.0f} tok/s, best strategy {r['vs_raw']['strategy']:,.0f} "
            f"tok/s; median ratio of {r['ratio_rounds']} alternating rounds **{r['vs_raw']['ratio']:.3f}** "
            "(target >= 0.98)."
        ),
        "",
        "| batch | vLLM strategy tok/s | HF eager tok/s | HF graphs tok/s | graphs / eager | vLLM / HF |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for b in BATCHES:
        g = f"{graphs[b]:,.0f}" if graphs else "n/a"
        gr = f"{graphs[b] / r['hf_eager'][b]:.2f}" if graphs else "n/a"
        vs_hf = r["vllm"][b] / r["hf_eager"][b]
        lines.append(f"| {b} | {r['vllm'][b]:,.0f} | {r['hf_eager'][b]:,.0f} | {g} | {gr} | {vs_hf:.2f} |")
    lines.append("")
    if not graphs:
        lines.append(
            f"No device graphs on `{r['device']}`: the HF strategy ran its eager path (the same bucket, "
            "pad and slice code); run the script on a GPU or NPU for the graphs column."
        )
        lines.append("")
    lines += render_prefill(r)
    lines += [
        (
            "When to use which: the vLLM strategy (paged KV cache, continuous batching, its own graphs) "
            "is the rollout engine for real runs; the HF strategy needs nothing beyond transformers, "
            "runs any causal LM transformers loads on any platform (the simulated NPU included), and "
            "serves where vLLM is unavailable or for checking vLLM's outputs."
        ),
        "",
        f"![rollout throughput]({PLOT.relative_to(DOC.parent)})",
    ]
    return "\n".join(lines)


def plot(r: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 2]})
    left.bar(
        ["vllm.LLM.generate", "vLLM strategy"],
        [r["vs_raw"]["raw"], r["vs_raw"]["strategy"]],
        color=["#888888", "#3b75af"],
    )
    left.set_title(f"same engine, {r['raw_batch']} prompts: ratio {r['vs_raw']['ratio']:.3f}")
    left.set_ylabel("generated tokens / s")
    series = [("vLLM strategy", r["vllm"], "#3b75af"), ("HF eager", r["hf_eager"], "#e08a2c")]
    if r["hf_graphs"]:
        series.append(("HF graphs", r["hf_graphs"], "#4c9a4c"))
    width = 0.8 / len(series)
    for k, (label, values, color) in enumerate(series):
        right.bar(
            [i + k * width for i in range(len(BATCHES))],
            [values[b] for b in BATCHES],
            width,
            label=label,
            color=color,
        )
    right.set_xticks(
        [i + width * (len(series) - 1) / 2 for i in range(len(BATCHES))], [f"batch {b}" for b in BATCHES]
    )
    right.set_ylabel("generated tokens / s")
    right.set_title(f"rollout strategies on {r['device']}")
    right.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


def measure_vllm(platform, model: str, args) -> dict:
    from roll_device.models.tiny import vocabulary

    vocab = len(vocabulary())
    say(f"vLLM strategy on {platform.name}: starting the engine")
    seqs = max(args.raw_batch, max(BATCHES))
    vllm = start("vllm", platform, model, f"max_num_seqs={seqs}", "kv_cache_bytes=268435456", "dtype=float32")
    try:
        say(f"vLLM strategy vs vllm.LLM.generate, {args.raw_batch} prompts")
        batch = prompts(args.raw_batch, args.prompt_length, vocab)
        vs_raw = strategy_vs_raw(vllm, batch, args.max_tokens, args.ratio_rounds)
        say("vLLM strategy per batch")
        return {
            "vs_raw": vs_raw,
            "vllm": per_batch(vllm, vocab, args.prompt_length, args.max_tokens, args.rounds),
        }
    finally:
        vllm.shutdown()


HF_PARTS = {  # part: (decode graphs, prefill graphs)
    "hf-eager": (False, False),
    "hf-graphs": (True, False),
    "hf-prefill-graphs": (True, True),
}


def measure_hf(platform, model: str, args, part: str) -> dict:
    """Generated tokens/s per batch, and (graph parts) prompt tokens/s of a prefill alone."""
    from roll_device.models.tiny import vocabulary

    use_graphs, prefill_graphs = HF_PARTS[part]
    say(f"HF strategy, {part}")
    hf = start(
        "hf",
        platform,
        model,
        f"max_batch_size={max(BATCHES)}",
        f"use_graphs={str(use_graphs).lower()}",
        f"prefill_graphs={str(prefill_graphs).lower()}",
    )
    measure = (len(vocabulary()), args.prompt_length, args.max_tokens, args.rounds)
    try:
        result = {"generate": per_batch(hf, *measure)}
        if use_graphs:
            result["prefill"] = per_batch(hf, *measure, prefill=True)
        return result
    finally:
        hf.shutdown()


def run_part(part: str, model: str, argv: list[str]) -> dict:
    """One measurement in a process of its own: an in-process vLLM engine binds the process's
    compute threads, which must not carry over to the HF measurements."""
    proc = subprocess.run(
        [sys.executable, __file__, "--part", part, "--model", model, *argv],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"benchmark part '{part}' failed with exit status {proc.returncode}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    return json.loads(lines[-1][len(RESULT) :])


def by_batch(values: dict) -> dict[int, float]:
    """A part's per-batch numbers with the batch keys JSON turned into strings made ints again."""
    return {int(b): v for b, v in values.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per batch size (best is kept)")
    parser.add_argument(
        "--ratio-rounds", type=int, default=21, help="paired rounds for the strategy-vs-raw ratio"
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--raw-batch", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--part", choices=["vllm", *HF_PARTS], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()

    import roll_device as rd

    platform = rd.current_platform()
    if args.part:
        if args.part == "vllm":
            result = measure_vllm(platform, args.model, args)
        else:
            result = measure_hf(platform, args.model, args, args.part)
        print(RESULT + json.dumps(result), flush=True)
        return

    from roll_device.models.tiny import make_tiny_model

    model = str(
        make_tiny_model(
            Path(tempfile.mkdtemp(prefix="rd-bench-")) / "tiny",
            num_layers=args.layers,
            hidden_size=args.hidden,
        )
    )
    results = {**setting(platform, args), **measure_parts(platform, model, args)}
    results["load_after"] = os.getloadavg()[0]
    write_results(results)
    say(f"wrote {DOC.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")
    print(f"vllm_strategy_vs_raw={results['vs_raw']['ratio']:.4f}")


def setting(platform, args) -> dict:
    """What the results were measured on and with."""
    return {
        "when": datetime.date.today().isoformat(),
        "device": platform.name,
        "simulated": platform.simulated,
        "host": f"{host.machine()}, {os.cpu_count()} CPU cores",
        **{k: getattr(args, k) for k in PART_ARGS},
        "load": os.getloadavg()[0],
    }


def measure_parts(platform, model: str, args) -> dict:
    """Each part in its own process: vLLM (with its ratio to raw vLLM), HF eager and, where the
    platform captures graphs, HF with decode graphs and with prefill graphs too."""
    argv = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in PART_ARGS]
    vllm = run_part("vllm", model, argv)
    results = {
        "vs_raw": vllm["vs_raw"],
        "vllm": {int(b): v for b, v in vllm["vllm"].items()},
        "hf_eager": by_batch(run_part("hf-eager", model, argv)["generate"]),
        "hf_graphs": None,
        "hf_prefill_graphs": None,
    }
    if platform.supports_graphs:
        decode_graphs = run_part("hf-graphs", model, argv)
        results["hf_graphs"] = by_batch(decode_graphs["generate"])
        results["hf_graphs_prefill"] = by_batch(decode_graphs["prefill"])
        both = run_part("hf-prefill-graphs", model, argv)
        results["hf_prefill_graphs"] = {key: by_batch(both[key]) for key in ("generate", "prefill")}
    else:
        say(f"no device graphs on {platform.name}: HF decode and prefill graphs not measured")
    return results


if __name__ == "__main__":
    main()
