"""One line per finished run of `roll-device run`, from its `metrics.jsonl`: steps, the mean reward
at the first and the last step, the mean seconds of each part of a step (the first step, which
includes warm-up, left out where there are others, and so is a step whose sync was cut short;
`swap` is the colocated turns: offload and reload), and rollout tokens per second.

python benchmarks/job_summary.py NAME RUN_DIR [SAMPLES_PER_STEP]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PARTS = ("rollout_s", "reward_s", "logprob_s", "train_s", "sync_s", "swap_s", "step_s")


def steps(run_dir: str | Path) -> list[dict]:
    """The run's step records (evaluation records left out); none where it wrote no metrics."""
    path = Path(run_dir) / "metrics.jsonl"
    records = (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )
    return [r for r in records if "reward_mean" in r]


def timed(records: list[dict]) -> list[dict]:
    """The steps that time a whole step: not the warm-up (where there are others), not a step whose
    sync was cut short (no weights version)."""
    whole = [r for r in records[1:] if r.get("weights_version") is not None]
    return whole or records


def step_means(records: list[dict], samples_per_step: int = 64) -> dict[str, float]:
    """Mean seconds of each part over the timed steps (a part the records lack counts 0), and
    `tokens_per_s`: generated tokens over rollout seconds."""
    kept = timed(records)
    means = {part: sum(r.get(part, 0.0) for r in kept) / len(kept) for part in PARTS}
    tokens = sum(r["response_len"] * samples_per_step for r in kept)
    means["tokens_per_s"] = tokens / sum(r["rollout_s"] for r in kept)
    return means


def summary(name: str, run_dir: str, samples_per_step: int = 64) -> str:
    records = steps(run_dir)
    if not records:
        return f"job {name}: no step finished (see {run_dir})"
    means = step_means(records, samples_per_step)
    parts = " ".join(f"{part.removesuffix('_s')}={means[part]:.3f}s" for part in PARTS)
    return (
        f"job {name}: {len(records)} steps, reward {records[0]['reward_mean']:.3f} -> "
        f"{records[-1]['reward_mean']:.3f}; per step {parts}; rollout {means['tokens_per_s']:.0f} tokens/s"
    )


if __name__ == "__main__":
    print(summary(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 64))
