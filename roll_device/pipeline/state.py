"""Pipeline checkpoints: `checkpoints/step_<N>/` holds the policy (written by the train
strategy) and, with PPO, the critic (by its strategy; `CHECKPOINTED`), `pipeline.json` (step, data position and epoch, RNG seed state) and `manifest.json` (the size and
CRC32 of every other file). A checkpoint is written into a temporary folder and renamed into place,
so a crash never leaves a half-written one; `latest` names the newest committed checkpoint.

`resume_point(mode)` picks where a resumed run starts, reading files only (before any worker
starts, writing nothing): the latest checkpoint when it passes `problem()`, else a ConfigError that
names the damaged file and offers the newest complete one, which `mode="latest_valid"` takes. A new
run refuses a folder that holds checkpoints (`refuse_overwrite`) unless told to replace them.
"""

from __future__ import annotations

import json
import shutil
import zlib
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from roll_device.errors import ConfigError

STATE_FILE = "pipeline.json"
MANIFEST_FILE = "manifest.json"
POLICY_DIR = "policy"  # the train strategy's own files, in each checkpoint
CHECKPOINTED = {"actor_train": POLICY_DIR, "critic": "critic"}  # roles saved, each in its folder
RUN_CONFIG_FILE = "config.yaml"  # the run's typed configuration, in its run directory
CHUNK_BYTES = 16 << 20


@dataclass
class PipelineState:
    step: int = 0  # optimizer steps completed
    data_position: int = 0  # prompts consumed
    data_epoch: int = 0  # passes over a dataset completed (the position determines it)
    sampling_seed: int = 0  # seed of the next rollout
    kl_coef: float | None = None  # the KL coefficient of the next step (None: algorithm.kl_coef)


# what every checkpoint's state holds; later fields have defaults (a checkpoint written before them)
REQUIRED_STATE = {"step", "data_position", "data_epoch", "sampling_seed"}


def file_crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
    return crc


def _manifest(folder: Path) -> dict[str, list[int]]:
    """Relative path -> [size, CRC32] of every file under `folder` but the manifest itself."""
    return {
        str(p.relative_to(folder)): [p.stat().st_size, file_crc32(p)]
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST_FILE
    }


def read_state(path: Path) -> PipelineState:
    """The pipeline state of checkpoint `path` (ValueError or OSError when unreadable)."""
    values = json.loads((path / STATE_FILE).read_text())
    names = {f.name for f in fields(PipelineState)}
    if not isinstance(values, dict) or not REQUIRED_STATE <= set(values) <= names:
        raise ValueError(f"{STATE_FILE} does not hold a pipeline state")
    return PipelineState(**values)


# A checkpoint a run continues from: its folder and the pipeline state saved there.
ResumePoint = tuple[Path, PipelineState]


def _step_number(path: Path) -> int:
    """N of a `step_<N>` checkpoint folder."""
    return int(path.name[5:])


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
        (staging / MANIFEST_FILE).write_text(json.dumps(_manifest(staging)))
        final = self.root / f"step_{state.step}"
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        (self.root / "latest.tmp").write_text(final.name)
        (self.root / "latest.tmp").rename(self.root / "latest")
        return final

    def prune(self, keep: int) -> list[Path]:
        """Remove the committed checkpoints older than the newest `keep` up to the latest one (those
        of later steps, left by a run resumed from an earlier checkpoint, are replaced as the run
        reaches them); returns the removed folders."""
        latest = self.latest_path()
        if latest is None:
            return []
        older = [p for p in self.steps() if _step_number(p) <= _step_number(latest)]
        for path in older[keep:]:
            shutil.rmtree(path)
        return older[keep:]

    def latest_path(self) -> Path | None:
        """The folder `latest` names (unchecked, maybe missing), or None before the first commit."""
        marker = self.root / "latest"
        return self.root / marker.read_text().strip() if marker.exists() else None

    def latest(self) -> ResumePoint | None:
        """The checkpoint `latest` names (unchecked), or None before the first commit."""
        path = self.latest_path()
        return None if path is None else (path, read_state(path))

    def steps(self) -> list[Path]:
        """Committed checkpoint folders, newest first."""
        found = [p for p in self.root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()]
        return sorted(found, key=_step_number, reverse=True)

    def problem(self, path: Path) -> str | None:
        """Why checkpoint `path` cannot be resumed from (a missing, truncated or changed file,
        an unreadable state), or None when it is complete."""
        if not path.is_dir():
            return "the folder is missing"
        try:
            read_state(path)
        except (OSError, ValueError, TypeError) as exc:
            return f"{STATE_FILE} is unreadable ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        try:
            manifest = json.loads((path / MANIFEST_FILE).read_text())
        except (OSError, ValueError) as exc:
            return f"{MANIFEST_FILE} is unreadable ({type(exc).__name__})"
        for name, (size, crc) in manifest.items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            if file.stat().st_size != size:
                return f"{name} has {file.stat().st_size} bytes, {size} were written"
            if file_crc32(file) != crc:
                return f"{name} changed since it was written (CRC32 mismatch)"
        return None

    def newest_complete(self, besides: Path) -> Path | None:
        """The newest committed checkpoint other than `besides` that passes `problem()`."""
        return next((p for p in self.steps() if p != besides and self.problem(p) is None), None)

    def refuse_overwrite(self, run_dir: Path) -> None:
        """A ConfigError when this folder holds checkpoints a new run (in `run_dir`) would replace."""
        found = self.steps()
        if found or (self.root / "latest").exists():
            newest = f" (the newest: {found[0].name})" if found else ""
            raise ConfigError(
                f"hydra.run.dir={run_dir} holds checkpoints{newest} that a new run would overwrite: "
                "continue them with resume=true, start in another folder with hydra.run.dir=<dir>, "
                "or replace them with overwrite=true"
            )

    def clear(self) -> None:
        """Remove every checkpoint here (a new run with overwrite=true)."""
        shutil.rmtree(self.root, ignore_errors=True)

    def resume_point(self, mode: bool | str) -> ResumePoint:
        """The checkpoint a run with `resume=mode` continues from, or a ConfigError."""
        latest = self.latest_path()
        if latest is None:
            raise ConfigError(
                f"resume={mode} but {self.root} holds no checkpoint: pass the run's directory with "
                "hydra.run.dir=<dir> (the folder that has checkpoints/), or set resume=false"
            )
        problem = self.problem(latest)
        if problem is None:
            return latest, read_state(latest)
        fallback = self.newest_complete(besides=latest)
        if fallback is not None and mode == "latest_valid":
            return fallback, read_state(fallback)
        offer = (
            f"resume=latest_valid continues from {fallback.name}, the newest complete checkpoint"
            if fallback is not None
            else "no earlier complete checkpoint exists: start a new run (resume=false, another hydra.run.dir or overwrite=true)"
        )
        raise ConfigError(f"the latest checkpoint {latest} is damaged: {problem}; {offer}")
