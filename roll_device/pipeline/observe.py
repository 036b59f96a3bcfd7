"""What the run tells the world about itself beside metrics.jsonl (docs/observability.md): its
trackers (`logger`), its workers' memory per role and phase, and the profiled steps.

`open_trackers(config, run_dir, start)` starts the trackers before Ray (a resumed run continues
their runs). `RunObserver` is called by the run's loop (roll_device/pipeline/experiment.py):
- `launching(step)` before the rollout of step `step` is launched: when it is a profiled step, the
  profiled roles' workers start their profile (their calls run in order, so the profile covers
  the step's calls from its rollout on; with `algorithm.max_staleness` > 0 a rollout is launched
  while an earlier step trains, which the profile then covers too);
- `after_sync(record)` once the step's weights are synced, before the next rollouts launch:
  every worker's memory readings of the phases it ran since the last step go into the record,
  and a profiled step's workers write their traces (`profiles/` in the run directory);
- `write(record)`: the record to every tracker.
A role hosted in another role's workers (a reference in the trainer's) is profiled and measured
in its host's workers.
"""

from __future__ import annotations

from pathlib import Path

from roll_device.pipeline.config import RunConfig
from roll_device.pipeline.roles import RoleGroups
from roll_device.pipeline.state import ResumePoint
from roll_device.pipeline.worker_base import PipelineWorker
from roll_device.tracking.memory import memory_metrics
from roll_device.tracking.registry import TrackerContext, Trackers

PROFILE_DIR = "profiles"


def open_trackers(config: RunConfig, run_dir: Path, start: ResumePoint | None) -> Trackers:
    """The run's trackers; a resumed run (from checkpoint `start`) continues their runs."""
    context = TrackerContext(
        run_dir,
        name=config.experiment.name,
        config=config.model_dump(mode="json"),
        settings=config.tracking,
        resumed=None if start is None else {},
        start_step=0 if start is None else start[1].step,
    )
    return Trackers.open(config.logger, context)


class RunObserver:
    """The run's trackers, memory readings and step profiles (see the module docstring)."""

    def __init__(self, config: RunConfig, run_dir: Path, roles: RoleGroups, trackers: Trackers) -> None:
        self.profile, self.roles, self.trackers = config.profile, roles, trackers
        self.trace_dir = run_dir / PROFILE_DIR
        self.profiled = list(dict.fromkeys(roles.hosted.get(r, r) for r in self.profile.roles))
        self.profiling: int | None = None  # the step whose profile is under way

    def launching(self, step: int) -> None:
        if not self.profile.covers(step):
            return
        groups, activities = self.roles.groups, list(self.profile.activities)
        for role in self.profiled:
            refs = groups[role].async_call_all(
                PipelineWorker.start_profile, step, activities, str(self.trace_dir)
            )
            self.roles.watch(role, refs)  # not waited for: the workers may be busy with earlier calls
        self.profiling = step

    def after_sync(self, record: dict) -> None:
        """The workers' memory into `record`; a profiled step's traces written."""
        groups = self.roles.groups
        reports = self.roles.wait(
            {role: group.async_call_all(PipelineWorker.memory_report) for role, group in groups.items()}
        )
        record.update(memory_metrics(reports))
        if self.profiling is not None and self.profiling <= record["step"]:
            self.stop_profiles()

    def stop_profiles(self) -> list[str]:
        """Stop the profiles under way; the traces' paths."""
        calls = {
            role: self.roles.groups[role].async_call_all(PipelineWorker.stop_profile)
            for role in self.profiled
        }
        written = [path for paths in self.roles.wait(calls).values() for path in paths if path]
        from tqdm import tqdm

        tqdm.write(f"step {self.profiling} profiled: {len(written)} trace(s) in {self.trace_dir}")
        self.profiling = None
        return written

    def write(self, record: dict, generations: list[dict], evaluation: bool) -> None:
        """A step's or an evaluation's record, and the generations shown with it, to the trackers."""
        self.trackers.log(record)
        if generations:
            name = "eval_generations" if evaluation else "generations"
            self.trackers.log_table(name, generations, int(record["step"]))
