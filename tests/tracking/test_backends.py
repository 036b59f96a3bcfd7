"""Each tracker backend driven in-process over a few steps, then a resumed run, read back from what
its own library wrote: TensorBoard's event files (tensorboard's EventAccumulator), MLflow's file
store (mlflow's client), wandb's offline run files (tests/tracking/wandb_records.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from roll_device.errors import ConfigError
from roll_device.tracking.registry import STATE_FILE, TrackerContext, Trackers
from roll_device.tracking.settings import TrackingSettings
from tests.tracking.wandb_records import read_run

CONFIG = {"max_steps": 4, "algorithm": {"kl_coef": 0.01, "advantage": "grpo"}}


def record(step: int) -> dict:
    """A step's record as the run writes it: numbers, nested numbers, and what no tracker takes."""
    return {
        "step": step,
        "reward_mean": step / 10,
        "eval_pass@1": 0.5,
        "sync_path": "colocated",
        "timeline": {"rollout": [1.0, 2.0]},
        "graph_guard": {"max_error": 0.25 * step},
        "memory/actor_train/update/device_used_mib": 100.0 + step,
    }


def drive(name: str, tmp_path, steps, resumed_from: int | None = None, mlflow_uri: str | None = None) -> None:
    """One run of tracker `name` logging `steps`; a resumed one when `resumed_from` is a step."""
    context = TrackerContext(
        tmp_path,
        name="tiny_grpo",
        config=CONFIG,
        settings=TrackingSettings(
            project="roll-device-test", mode="offline", mlflow_tracking_uri=mlflow_uri, generations=1
        ),
        resumed=None if resumed_from is None else {},
        start_step=resumed_from or 0,
    )
    trackers = Trackers.open([name], context)
    for step in steps:
        trackers.log(record(step))
        trackers.log_table("generations", generations(step), step)
    trackers.close(ok=True)


def generations(step: int) -> list[dict]:
    """A step's generations as the run shows them (roll_device/pipeline/generations.py)."""
    return [
        {"step": step, "eval": False, "prompt": "1|2=", "response": f"{step}", "answer": None, "reward": 0.5}
    ]


KEYS = {"reward_mean", "eval_pass_at_1", "graph_guard/max_error", "memory/actor_train/update/device_used_mib"}


def test_tensorboard_event_files_hold_every_step_across_a_resume(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    drive("tensorboard", tmp_path, [1, 2, 3])  # step 3 after the checkpoint at 2: dropped by the resume
    drive("tensorboard", tmp_path, [3, 4], resumed_from=2)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == KEYS
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("reward_mean")] == [
        (1, 0.1),
        (2, 0.2),
        (3, 0.3),
        (4, 0.4),
    ]
    assert events.Tags()["tensors"] == ["config/text_summary", "generations/text_summary"], "config once"
    shown = [
        (e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors("generations/text_summary")
    ]
    # TensorBoard's reader purges scalars after a resume, not text: the first run's step 3 is read too
    assert sorted({step for step, _ in shown}) == [1, 2, 3, 4]
    assert shown[0][1].splitlines() == [
        "| step | eval | prompt | response | answer | reward |",
        "|---|---|---|---|---|---|",
        "| 1 | False | 1\\|2= | 1 | None | 0.5 |",
    ]


def test_mlflow_file_store_continues_the_same_run_on_resume(tmp_path):
    from mlflow.tracking import MlflowClient

    drive("mlflow", tmp_path, [1, 2])
    run_id = json.loads((tmp_path / STATE_FILE).read_text())["mlflow"]["run_id"]
    drive("mlflow", tmp_path, [3, 4], resumed_from=2)
    assert json.loads((tmp_path / STATE_FILE).read_text())["mlflow"]["run_id"] == run_id
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run = client.get_run(run_id)
    assert set(run.data.metrics) == KEYS
    history = client.get_metric_history(run_id, "reward_mean")
    assert [(m.step, round(m.value, 3)) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    assert run.data.params["algorithm.advantage"] == "grpo" and run.info.status == "FINISHED"
    tables = [a.path for a in client.list_artifacts(run_id, "generations")]
    assert tables == [f"generations/step_00000{step}.json" for step in (1, 2, 3, 4)]
    table = json.loads(Path(client.download_artifacts(run_id, tables[3], str(tmp_path))).read_text())
    assert table["columns"][:4] == ["step", "eval", "prompt", "response"] and table["data"][0][3] == "4"
    experiments = client.search_experiments()
    assert [e.name for e in experiments if e.name != "Default"] == ["roll-device-test"]


def test_mlflow_takes_a_folder_as_its_store_and_an_unknown_scheme_is_one_line(tmp_path):
    from mlflow.tracking import MlflowClient

    drive("mlflow", tmp_path, [1], mlflow_uri=str(tmp_path / "store"))  # a path, not a file: URI
    run_id = json.loads((tmp_path / STATE_FILE).read_text())["mlflow"]["run_id"]
    assert MlflowClient(tracking_uri=str(tmp_path / "store")).get_run(run_id).info.status == "FINISHED"
    with pytest.raises(ConfigError) as refused:
        drive("mlflow", tmp_path, [1], mlflow_uri="nosuch://x")
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith(
        "logger=mlflow: the tracker did not start (UnsupportedModelRegistryStoreURIException: Model "
        "registry functionality is unavailable; got unsupported URI 'nosuch://x'"
    )
    assert str(refused.value).endswith(
        "check its settings under tracking (docs/observability.md), or leave mlflow out of logger"
    )


def test_wandb_offline_run_resumes_the_same_run_with_continuous_steps(tmp_path):
    drive("wandb", tmp_path, [1, 2])
    run_id = json.loads((tmp_path / STATE_FILE).read_text())["wandb"]["id"]
    # wandb names an offline run's folder by the second it starts (`offline-run-<date>_<time>-<id>`):
    # a resume within the same second would write into its predecessor's folder
    time.sleep(1 - time.time() % 1)
    drive("wandb", tmp_path, [3, 4], resumed_from=2)
    runs = [read_run(path) for path in (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")]
    runs.sort(key=lambda run: min((row["_step"] for row in run["history"]), default=-1))  # in order of steps
    assert [run["id"] for run in runs] == [run_id, run_id]
    assert runs[0]["config"]["algorithm"] == CONFIG["algorithm"] and "algorithm" not in runs[1]["config"]
    rows = [row for run in runs for row in run["history"]]
    assert [row["_step"] for row in rows] == [1, 2, 3, 4]
    assert KEYS <= set(rows[0]) and rows[3]["reward_mean"] == pytest.approx(0.4)
    tables = [(row["generations/_type"], row["generations/nrows"]) for row in rows]  # nested keys, joined
    assert tables == [("table-file", 1)] * 4, "each step's generations a wandb Table"


def test_console_prints_one_line_per_step_without_the_nested_keys(tmp_path, capsys):
    drive("console", tmp_path, [1])
    line = capsys.readouterr().out.strip()
    assert line.startswith("step 1: reward_mean=0.1 eval_pass_at_1=0.5")
    assert "graph_guard/max_error" not in line, "nested keys go to the other trackers"
