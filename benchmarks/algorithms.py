"""The recipes (`algorithm=<recipe>`, configs/algorithm/) on the default tiny task: each trains the
same job (same seed, model, prompts, steps) as `roll-device run` in its own process, on this
machine's CPU. Results replace the algorithms section of docs/benchmarks.md: each recipe's mean
reward over its first and last 5 steps, its optimizer steps a step, its median step time and the
critic's part of it (`ppo`), and the reward curves in one plot (docs/algorithms_benchmark.png); the
last line printed is `recipes_rising=<n>/<total>`.

    .venv/bin/python benchmarks/algorithms.py [--steps 30]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "algorithms_benchmark.png"
RECIPES = ("grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "ppo")


def run_recipe(recipe: str, steps: int, run_dir: Path) -> list[dict]:
    """The step records of one `roll-device run algorithm=<recipe>`."""
    command = [sys.executable, "-c", "import sys; from roll_device.cli import main; sys.exit(main())", "run"]
    args = [f"algorithm={recipe}", f"max_steps={steps}", "save_every=0", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([*command, *args], check=False, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"algorithm={recipe} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary(records: list[dict]) -> dict:
    rewards = [r["reward_mean"] for r in records]
    return {
        "first": statistics.mean(rewards[:5]),
        "last": statistics.mean(rewards[-5:]),
        "step_s": statistics.median(r["step_s"] for r in records),
        "updates": statistics.median(r["updates"] for r in records),
        "critic_s": statistics.median(r.get("critic_s", 0.0) for r in records),  # 0 without a critic
        "rewards": rewards,
    }


def plot(results: dict[str, dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for recipe, result in results.items():
        ax.plot(range(1, len(result["rewards"]) + 1), result["rewards"], label=recipe)
    ax.set(xlabel="step", ylabel="mean reward", title="recipes on the tiny digits task (same seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=100)


def section(results: dict[str, dict], steps: int) -> str:
    rows = [
        f"| `{recipe}` | {r['first']:.3f} | {r['last']:.3f} | {r['updates']:g} | {r['step_s']:.2f} | "
        f"{r['critic_s']:.2f} |"
        for recipe, r in results.items()
    ]
    return "\n".join(
        [
            "## Recipes on the tiny task (`benchmarks/algorithms.py`)",
            "",
            f"{datetime.date.today()}, this machine's CPU (every role on it), {steps} steps of the default",
            "job per recipe, same seed. Mean reward over the first and the last 5 steps, the median",
            "optimizer steps a step (`updates`: the recipe's `mini_batches`, fewer where DAPO's dynamic",
            "sampling kept a small batch), median step time, and the median seconds of the critic's values",
            "and update inside it (`ppo`'s critic, `critic_s`).",
            "",
            "| recipe | reward, first 5 | reward, last 5 | updates | step s | critic s |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"![reward curves]({PLOT.name})",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    steps = parser.parse_args().steps
    with tempfile.TemporaryDirectory() as tmp:
        results = {recipe: summary(run_recipe(recipe, steps, Path(tmp) / recipe)) for recipe in RECIPES}
    plot(results)
    replace_section(DOC, "algorithms", section(results, steps))
    rising = sum(r["last"] > r["first"] for r in results.values())
    print(f"recipes_rising={rising}/{len(results)}")


if __name__ == "__main__":
    main()
