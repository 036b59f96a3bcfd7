"""`PipelineWorker`: the base of the pipeline's role workers (a `RoleWorker` whose output goes to
the run directory's `logs/<role>_<rank>.log` once `capture_output` is called, see
`roll_device.pipeline.output`). Light on purpose: the reward worker starts from it alone (the
strategies are imported only by workers that start one)."""

from __future__ import annotations

from pathlib import Path

from roll_device.cluster import RoleWorker
from roll_device.pipeline.output import capture_output


class PipelineWorker(RoleWorker):
    def capture_output(self, log_dir: str) -> None:
        capture_output(Path(log_dir) / f"{self.role}_{self.rank}.log")

    def new_strategy(self, qualified: str):
        """The strategy class `qualified` names (`package.module:Class`), bound to this worker's
        platform; a ConfigError when it does not run on this kind."""
        from strategies.registry import load, serving

        return serving(load(qualified), self.platform.kind, f"strategy {qualified}")(self.platform)
