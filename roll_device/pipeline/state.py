"""Pipeline checkpoints: `checkpoints/step_<N>/` holds the policy (written by the train
strategy) and `pipeline.json` (step, data position and epoch, RNG seed state). A checkpoint is written
into a temporary folder and renamed into place, so a crash never leaves a half-written one;
`latest` names the newest complete checkpoint."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_FILE = "pipeline.json"


@dataclass
class PipelineState:
    step: int = 0  # optimizer steps completed
    data_position: int = 0  # prompts consumed
    data_epoch: int = 0  # passes over a dataset completed (the position determines it)
    sampling_seed: int = 0  # seed of the next rollout


class Checkpoints:
    def __init__(self, run_dir: Path) -> None:
        self.root = Path(run_dir) / "checkpoints"

    def staging_dir(self, step: int) -> Path:
        """An empty folder to write step `step` into before `commit`."""
        staging = self.root / f".step_{step}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        return staging

    def commit(self, staging: Path, state: PipelineState) -> Path:
        (staging / STATE_FILE).write_text(json.dumps(asdict(state)))
        final = self.root / f"step_{state.step}"
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        (self.root / "latest.tmp").write_text(final.name)
        (self.root / "latest.tmp").rename(self.root / "latest")
        return final

    def latest(self) -> tuple[Path, PipelineState] | None:
        marker = self.root / "latest"
        if not marker.exists():
            return None
        path = self.root / marker.read_text().strip()
        return path, PipelineState(**json.loads((path / STATE_FILE).read_text()))
