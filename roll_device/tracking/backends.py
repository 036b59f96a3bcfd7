"""The trackers `logger` can name, each over its own library (imported when it starts; its
package is an extra of roll-device, checked before Ray starts).

- `console`: one line of every metric per step;
- `tensorboard`: event files in `<run_dir>/tensorboard` (torch's `SummaryWriter`); a resumed run
  purges the events after the step it resumed from;
- `wandb`: `<run_dir>/wandb`, offline unless `tracking.mode=online`; a resumed run continues the
  same wandb run (its id, `resume="allow"`);
- `mlflow`: a file store under `<run_dir>/mlruns` unless `tracking.mlflow_tracking_uri` names
  another (a server, refused before Ray starts when nothing answers at its address, where MLflow
  would retry for minutes); a resumed run continues the same MLflow run (its id);
- `swanlab`: `<run_dir>/swanlog`, offline unless `tracking.mode=online`; a resumed run starts a new
  SwanLab run (its steps go on from the resumed one).

Each but the console and SwanLab also takes a step's generations as a table (`log_table`: a
TensorBoard text summary in Markdown, a wandb Table, an MLflow table artifact per step).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import yaml

from roll_device.errors import ConfigError
from roll_device.tracking.registry import Tracker, TrackerContext, flatten, register
from roll_device.tracking.settings import TrackingSettings

SERVER_TIMEOUT_S = 5.0  # a tracking server's address that does not answer in this time is refused


def config_text(context: TrackerContext) -> str:
    return yaml.safe_dump(context.config, sort_keys=False)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """`rows` as a Markdown table (TensorBoard renders its text summaries as Markdown)."""
    columns = list(rows[0])

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


@register
class ConsoleTracker(Tracker):
    name = "console"

    def log(self, metrics: dict[str, float], step: int) -> None:
        """The step's own numbers in one line; the nested ones (memory per role and phase, the
        timeline's spans: keys with a '/') go to the other trackers and metrics.jsonl only."""
        from tqdm import tqdm  # above the run's progress bar

        shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if "/" not in k)
        tqdm.write(f"step {step}: {shown}")


@register
class TensorBoardTracker(Tracker):
    name, package, extra = "tensorboard", "tensorboard", "tensorboard"

    def __init__(self, context: TrackerContext) -> None:
        super().__init__(context)
        from torch.utils.tensorboard import SummaryWriter

        # a resumed run drops the events its predecessor wrote after the checkpoint
        purge = None if context.new_run else context.start_step + 1
        self.writer = SummaryWriter(str(context.run_dir / "tensorboard"), purge_step=purge)
        if context.new_run:
            self.writer.add_text("config", f"```yaml\n{config_text(context)}```", 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        self.writer.add_text(name, markdown_table(rows), step)
        self.writer.flush()

    def finish(self, ok: bool) -> None:
        self.writer.close()


@register
class WandbTracker(Tracker):
    name, package, extra = "wandb", "wandb", "wandb"

    def __init__(self, context: TrackerContext) -> None:
        super().__init__(context)
        import wandb

        resumed = context.resumed or {}
        self.run = wandb.init(
            project=context.settings.project,
            name=context.name,
            dir=str(context.run_dir),
            mode=context.settings.mode,
            id=resumed.get("id"),  # None: a new run, its id chosen by wandb
            resume="allow",
            config=context.config if context.new_run else None,
            settings=wandb.Settings(console="off", silent=True),
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        import wandb

        columns = list(rows[0])
        self.run.log(
            {name: wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in rows])}, step=step
        )

    def finish(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)

    def state(self) -> dict:
        return {"id": self.run.id}


@register
class MlflowTracker(Tracker):
    name, package, extra = "mlflow", "mlflow", "mlflow"
    PARAMS_PER_CALL = 100  # MLflow's limit of params in one log_batch

    def __init__(self, context: TrackerContext) -> None:
        super().__init__(context)
        from mlflow.tracking import MlflowClient

        uri = context.settings.mlflow_tracking_uri or (context.run_dir / "mlruns").resolve().as_uri()
        if urlsplit(uri).scheme in ("", "file"):  # a folder: MLflow 3 keeps its file store behind this opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        self.run_id = (context.resumed or {}).get("run_id") or self._new_run()

    @classmethod
    def check(cls, settings: TrackingSettings) -> None:
        uri = settings.mlflow_tracking_uri or ""
        address = urlsplit(uri)
        if address.scheme not in ("http", "https"):
            return
        port = address.port or (443 if address.scheme == "https" else 80)
        try:
            socket.create_connection((address.hostname, port), timeout=SERVER_TIMEOUT_S).close()
        except OSError as exc:
            raise ConfigError(
                f"tracking.mlflow_tracking_uri={uri}: nothing answers at {address.hostname}:{port} ({exc}): "
                "start the MLflow server, or set it to null for a file store under the run directory"
            ) from None

    def _new_run(self) -> str:
        project = self.context.settings.project
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
        run_id = self.client.create_run(experiment_id, run_name=self.context.name).info.run_id
        self._log_config(run_id)
        return run_id

    def _log_config(self, run_id: str) -> None:
        from mlflow.entities import Param

        self.client.log_dict(run_id, self.context.config, "config.yaml")
        params = [Param(k, str(v)[:6000]) for k, v in flatten(self.context.config, ".").items()]
        for start in range(0, len(params), self.PARAMS_PER_CALL):
            self.client.log_batch(run_id, params=params[start : start + self.PARAMS_PER_CALL])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        """An artifact per step, `<name>/step_<step>.json`, laid out as MLflow's `log_table` writes a
        table (`columns`, `data`; that call needs pandas, which MLflow does not install)."""
        columns = list(rows[0])
        table = {"columns": columns, "data": [[row[c] for c in columns] for row in rows]}
        self.client.log_dict(self.run_id, table, f"{name}/step_{step:06d}.json")

    def finish(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "FAILED")

    def state(self) -> dict:
        return {"run_id": self.run_id}


@register
class SwanlabTracker(Tracker):
    """SwanLab (not installed in the project's test environments: untested beyond its refusal)."""

    name, package, extra = "swanlab", "swanlab", "swanlab"

    def __init__(self, context: TrackerContext) -> None:
        super().__init__(context)
        import swanlab

        self.swanlab = swanlab
        swanlab.init(
            project=context.settings.project,
            experiment_name=context.name,
            config=context.config,
            logdir=str(context.run_dir / "swanlog"),
            mode="offline" if context.settings.mode == "offline" else "cloud",
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.swanlab.log(metrics, step=step)

    def finish(self, ok: bool) -> None:
        self.swanlab.finish()
