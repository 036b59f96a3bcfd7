"""`PipelineWorker`: the base of the pipeline's role workers (a `RoleWorker` whose output goes to
the run directory's `logs/<role>_<rank>.log` once `capture_output` is called, see
`roll_device.pipeline.output`). Light on purpose: the reward worker starts from it alone (the
strategies are imported only by workers that start one).

Each worker observes its own phases (`@phase` on its methods, roll_device/tracking/phases.py): the
run asks every worker for its memory per phase after each step (`memory_report`) and the chosen
roles' workers to profile the chosen steps (`start_profile` / `stop_profile`)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from roll_device.cluster import RoleWorker
from roll_device.pipeline.output import capture_output
from roll_device.tracking.memory import Reading
from roll_device.tracking.phases import WorkerObserver


class PipelineWorker(RoleWorker):
    def capture_output(self, log_dir: str) -> None:
        capture_output(Path(log_dir) / f"{self.role}_{self.rank}.log")

    def new_strategy(self, qualified: str):
        """The strategy class `qualified` names (`package.module:Class`), bound to this worker's
        platform; a ConfigError when it does not run on this kind."""
        from strategies.registry import load, serving

        return serving(load(qualified), self.platform.kind, f"strategy {qualified}")(self.platform)

    @cached_property
    def observer(self) -> WorkerObserver:
        return WorkerObserver(self.platform, self.role, self.rank)

    def memory_report(self) -> dict[str, Reading]:
        """This worker's largest memory readings of each phase since its last report."""
        return self.observer.memory_report()

    def start_profile(self, step: int, activities: list[str], trace_dir: str) -> None:
        """Profile this worker's calls from now until `stop_profile`, as step `step`."""
        self.observer.start_profile(step, activities, Path(trace_dir))

    def stop_profile(self) -> str | None:
        """Write the profile's trace; its path."""
        return self.observer.stop_profile()
