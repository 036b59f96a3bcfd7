"""A whole run observed (slow: two short runs on Ray): trackers beside metrics.jsonl, memory per
role and phase in every record with memory.png, a profiled step's traces from the chosen roles'
workers, each step's generations in generations.jsonl and as the trackers' tables, and a resumed
run that continues the tracker runs and their step numbers."""

from __future__ import annotations

import json

import pytest

from roll_device.commands.run import run_checked
from roll_device.pipeline.observe import PROFILE_DIR
from roll_device.tracking.registry import STATE_FILE
from tests.configs import run_config

OVERRIDES = (
    "max_steps=2",
    "save_every=1",
    "data.prompts_per_step=2",
    "algorithm.samples_per_prompt=2",
    "logger=[console,tensorboard,mlflow]",
    "profile.steps=[2]",
    "profile.roles=[actor_infer,reference,reward]",
    "tracking.generations=2",
)


@pytest.mark.slow
def test_a_run_is_tracked_measured_profiled_and_resumed_in_the_same_tracker_run(tmp_path):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = run_checked(run_config(*OVERRIDES), tmp_path / "run")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for role, phase in (("actor_infer", "rollout"), ("actor_train", "logprobs"), ("actor_train", "sync")):
        assert all(r[f"memory/{role}/{phase}/device_used_mib"] > 0 for r in records)
    assert (run_dir / "memory.png").read_bytes()[:4] == b"\x89PNG"
    traces = sorted(p.name for p in (run_dir / PROFILE_DIR).iterdir())
    assert traces == ["actor_infer_0.step2.json", "actor_train_0.step2.json", "reward_0.step2.json"]
    ranges = {
        e["name"]
        for e in json.loads((run_dir / PROFILE_DIR / "actor_train_0.step2.json").read_text())["traceEvents"]
        if e.get("cat") == "user_annotation"
    }
    assert {"logprobs", "update", "sync"} <= ranges, "the reference is profiled in its host, the trainer"
    run_id = json.loads((run_dir / STATE_FILE).read_text())["mlflow"]["run_id"]

    resumed = run_checked(run_config(*OVERRIDES, "max_steps=3", "resume=true", "profile.steps=[]"), run_dir)
    assert json.loads((resumed / STATE_FILE).read_text())["mlflow"]["run_id"] == run_id
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    assert [m.step for m in client.get_metric_history(run_id, "reward_mean")] == [1, 2, 3]
    tables = [a.path for a in client.list_artifacts(run_id, "generations")]
    assert tables == [f"generations/step_00000{step}.json" for step in (1, 2, 3)], "each step's generations"
    shown = [json.loads(line) for line in (run_dir / "generations.jsonl").read_text().splitlines()]
    assert [g["step"] for g in shown] == [1, 1, 2, 2, 3, 3]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("memory/actor_infer/rollout/host_rss_mib")] == [1, 2, 3]
