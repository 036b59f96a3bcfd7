"""Start-up of the default job, measured in one run on this machine:

1. the default job (`roll-device run`, tiny model already made) from the command to its first
   finished step (the first line of its metrics.jsonl), with its own timeline (cluster ready,
   preflight, workers ready);
2. the parts it is made of, each done bare in a fresh process: Ray start (`ray.init` on this
   machine), vLLM (import, engine start on the tiny model, first generate of the step's 8 x 8
   samples), and a trainer (import torch and transformers, load the model, one AdamW step on the
   step's batch).

The ratio job / (sum of parts) says what the pipeline adds on top of doing the work itself (the
job runs the rollout and trainer start-ups side by side, so on enough cores it can beat the sum).
Each measurement is the best of `--rounds` rounds, rounds interleaving job and parts. Results
replace the startup section of docs/benchmarks.md; the last line printed is
`startup_ratio=<ratio> first_step_s=<seconds>`.

    .venv/bin/python benchmarks/startup.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as host
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "startup_benchmark.png"
READY = "PART-READY"

RAY_PART = f"""
import ray
ray.init(num_cpus=2, include_dashboard=False)
print("{READY}", flush=True)
ray.shutdown()
"""

VLLM_PART = f"""
import os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], enforce_eager=True, dtype="float32", max_model_len=256,
          kv_cache_memory_bytes=256 * 1024 * 1024, seed=0)
prompts = [{{"prompt_token_ids": [1, 3 + i, 4, 5, 6, 7, 8, 20]}} for i in range(8)]
llm.generate(prompts, SamplingParams(n=8, max_tokens=8, temperature=1.0), use_tqdm=False)
print("{READY}", flush=True)
"""

TRAIN_PART = f"""
import sys
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(3, 40, (64, 15))
logits = model(input_ids=ids).logits
loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
loss.backward()
optimizer.step()
print("{READY}", flush=True)
"""

PARTS = {
    "ray start": RAY_PART,
    "vLLM import + engine + first generate": VLLM_PART,
    "trainer start + first step": TRAIN_PART,
}
TIMELINE = {
    "cluster ready": re.compile(r"cluster ready in ([\d.]+)s"),
    "preflight": re.compile(r"preflight: .*\(([\d.]+)s\)"),
    "workers ready": re.compile(r"workers ready in ([\d.]+)s"),
}


def say(message: str) -> None:
    print(f"[startup-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


def time_part(code: str, model: str) -> float:
    """Seconds from starting a fresh interpreter to its READY line."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", code, model],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env(),
    )
    for line in child.stdout:
        if line.strip() == READY:
            elapsed = time.perf_counter() - start
            child.wait()
            return elapsed
    raise RuntimeError(f"part exited with {child.wait()} before it was ready")


def time_job(model_dir: Path, run_dir: Path) -> tuple[float, dict[str, float]]:
    """Seconds from the command to the first metrics line, and the job's own timeline."""
    command = [
        sys.executable,
        "-c",
        "import sys; from roll_device.cli import main; sys.exit(main())",
        "run",
        "max_steps=1",
        "save_every=0",
        f"model.tiny_dir={model_dir}",
        f"hydra.run.dir={run_dir}",
    ]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env())
    metrics, first_step = run_dir / "metrics.jsonl", None
    while child.poll() is None and first_step is None:
        if metrics.exists() and metrics.read_text().strip():
            first_step = time.perf_counter() - start
        time.sleep(0.05)
    out = child.communicate()[0]
    if child.returncode != 0 and first_step is None:
        raise RuntimeError(f"the job failed ({child.returncode}):\n{out}")
    first_step = first_step if first_step is not None else time.perf_counter() - start
    timeline = {name: float(m.group(1)) for name, rx in TIMELINE.items() if (m := rx.search(out))}
    timeline["first step"] = json.loads(metrics.read_text().splitlines()[0])["step_s"]
    timeline["before the cluster"] = first_step - timeline.get("workers ready", 0.0) - timeline["first step"]
    return first_step, timeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from roll_device.models.tiny import make_tiny_model

    work = Path(tempfile.mkdtemp(prefix="startup-bench-"))
    model = str(make_tiny_model(work / "tiny"))
    load_before = os.getloadavg()[0]
    jobs, timelines, parts = [], [], {name: [] for name in PARTS}
    for r in range(args.rounds):
        seconds, timeline = time_job(work / "tiny", work / f"run{r}")
        jobs.append(seconds)
        timelines.append(timeline)
        say(f"round {r + 1}: job first step {seconds:.1f}s {timeline}")
        for name, code in PARTS.items():
            parts[name].append(time_part(code, model))
            say(f"round {r + 1}: {name} {parts[name][-1]:.1f}s")
    best = {name: min(values) for name, values in parts.items()}
    job = min(jobs)
    timeline = timelines[jobs.index(job)]
    total = sum(best.values())
    ratio = job / total
    write_doc(job, timeline, best, total, ratio, args.rounds, load_before, os.getloadavg()[0])
    plot(job_segments(timeline), best)
    print(f"startup_ratio={ratio:.2f} first_step_s={job:.1f}")


def job_segments(timeline: dict[str, float]) -> dict[str, float]:
    """The job's time to its first step, in consecutive segments."""
    cluster, preflight = timeline.get("cluster ready", 0.0), timeline.get("preflight", 0.0)
    return {
        "driver before the cluster": timeline["before the cluster"],
        "cluster": cluster,
        "preflight": preflight,
        "workers": timeline.get("workers ready", 0.0) - cluster - preflight,
        "first step": timeline["first step"],
    }


def plot(segments: dict[str, float], parts: dict[str, float]) -> None:
    """Two stacked bars: the job's segments, and the parts done bare."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 2.6))
    for row, bars in enumerate((parts, segments)):
        left = 0.0
        for name, seconds in bars.items():
            ax.barh(row, seconds, left=left, edgecolor="white")
            if seconds > 1.5:
                ax.text(
                    left + seconds / 2,
                    row,
                    f"{textwrap.fill(name, 14)}\n{seconds:.1f}s",
                    ha="center",
                    va="center",
                    fontsize=7,
                )
            left += seconds
    ax.set_yticks([0, 1], ["parts, bare", "default job"])
    ax.set_xlabel("seconds to the first finished step")
    ax.set_title(f"start-up: job {sum(segments.values()):.1f}s vs parts {sum(parts.values()):.1f}s")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


def write_doc(job, timeline, best, total, ratio, rounds, load_before, load_after) -> None:
    rows = "\n".join(f"| {name} | {seconds:.1f} |" for name, seconds in best.items())
    steps = (
        f"driver start-up before the cluster (interpreter, imports, config, tokenizer, data) "
        f"{timeline['before the cluster']:.1f} s; then, from the cluster's start: cluster ready at "
        f"{timeline.get('cluster ready', 0):.1f} s, preflight done {timeline.get('preflight', 0):.1f} s later, "
        f"workers ready at {timeline.get('workers ready', 0):.1f} s; the first step itself "
        f"{timeline['first step']:.1f} s"
    )
    body = f"""## Start-up of the default job (`benchmarks/startup.py`)

Run {datetime.date.today()} on {host.machine()} with {os.cpu_count()} CPU cores; the default job
(`roll-device run`, tiny model already made) against its parts done bare, each in a fresh process;
best of {rounds} interleaved rounds. The machine is shared: its 1-minute load average was
{load_before:.1f} before and {load_after:.1f} after, so absolute seconds carry noise; the ratio
compares measurements taken side by side.

**Default job, command to first finished step: {job:.1f} s**; sum of the parts bare: {total:.1f} s;
**ratio {ratio:.2f}** (goal: at most 1.3; the job within 30 s).

![start-up](startup_benchmark.png)

| part, done bare | seconds |
|---|---:|
{rows}

The job's own timeline: {steps}.
"""
    replace_section(DOC, "startup", body)


if __name__ == "__main__":
    main()
