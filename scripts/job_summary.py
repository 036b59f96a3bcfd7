"""One line per finished run of `roll-device run`, from its `metrics.jsonl`: steps, the mean reward
at the first and the last step, the mean seconds of each part of a step (the first step, which
includes warm-up, left out where there are others; `swap` is the colocated turns: offload and
reload), and rollout tokens per second.

python scripts/job_summary.py NAME RUN_DIR [SAMPLES_PER_STEP]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PARTS = ("rollout_s", "reward_s", "logprob_s", "train_s", "sync_s", "swap_s", "step_s")


def summary(name: str, run_dir: str, samples_per_step: int = 64) -> str:
    path = Path(run_dir) / "metrics.jsonl"
    records = (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )
    steps = [r for r in records if "reward_mean" in r]
    if not steps:
        return f"job {name}: no step finished (see {run_dir})"
    timed = steps[1:] or steps
    means = {part: sum(r[part] for r in timed) / len(timed) for part in PARTS}
    tokens = sum(r["response_len"] * samples_per_step for r in timed) / sum(r["rollout_s"] for r in timed)
    parts = " ".join(f"{part.removesuffix('_s')}={means[part]:.3f}s" for part in PARTS)
    return (
        f"job {name}: {len(steps)} steps, reward {steps[0]['reward_mean']:.3f} -> "
        f"{steps[-1]['reward_mean']:.3f}; per step {parts}; rollout {tokens:.0f} tokens/s"
    )


if __name__ == "__main__":
    print(summary(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 64))
