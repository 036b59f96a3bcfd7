"""A worker's phases on the CPU: each decorated call is a named range in the step's profile, one
Chrome trace per worker and step labelled with who wrote it, and the worker's memory read after
each phase. The workers are the pipeline's own classes (`PipelineWorker` and the reward worker),
built without Ray: their platform, role and rank set as `RoleWorker` sets them."""

from __future__ import annotations

import json

import pytest
import torch

import roll_device as rd
from roll_device.inputs.rewards import Scoring
from roll_device.pipeline.reward_worker import RewardWorker
from roll_device.pipeline.worker_base import PipelineWorker
from roll_device.tracking.memory import READINGS, memory_metrics
from roll_device.tracking.phases import PHASES, phase
from tests.configs import run_config
from tests.isolated import run_isolated


class StepWorker(PipelineWorker):
    """A worker whose calls are the step's phases, each a little real work."""

    def work(self) -> float:
        return torch.mm(torch.ones(32, 32), torch.ones(32, 32)).sum().item()

    rollout = phase("rollout")(work)
    logprobs = phase("logprobs")(work)
    update = phase("update")(work)
    sync = phase("sync")(work)
    turns = phase("turns")(work)


def bare(cls: type, role: str, rank: int = 0):
    """A worker of `cls` without Ray: bound as `RoleWorker.__init__` binds it."""
    worker = object.__new__(cls)
    worker.platform, worker.role, worker.rank = rd.get_platform("cpu"), role, rank
    return worker


def test_a_profiled_step_writes_one_labelled_trace_with_each_phase_as_a_range(tmp_path):
    worker = bare(StepWorker, "actor_train", rank=1)
    worker.start_profile(2, ["cpu", "device"], str(tmp_path))
    for name in ("rollout", "logprobs", "update", "sync", "turns"):
        getattr(worker, name)()
    path = worker.stop_profile()
    assert path == str(tmp_path / "actor_train_1.step2.json")
    trace = json.loads((tmp_path / "actor_train_1.step2.json").read_text())
    ranges = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    assert ranges == ["rollout", "logprobs", "update", "sync", "turns"]
    mm = [e for e in trace["traceEvents"] if e.get("name") == "aten::mm"]
    assert len(mm) == 5, "the phases' own work is in the trace"
    assert trace["roll_device"] == {
        "role": "actor_train",
        "rank": 1,
        "step": 2,
        "platform": "cpu",
        "simulated": False,
    }
    assert worker.stop_profile() is None, "one trace per profile"


def test_phases_outside_a_profile_write_nothing_and_report_memory_once(tmp_path):
    worker = bare(StepWorker, "actor_infer")
    worker.rollout()
    worker.sync()
    worker.sync()
    report = worker.memory_report()
    assert sorted(report) == ["rollout", "sync"]
    for reading in report.values():
        assert set(reading) == set(READINGS) and all(value > 0 for value in reading.values())
    assert worker.memory_report() == {}, "a report covers the phases since the last one"
    assert list(tmp_path.iterdir()) == []


def test_the_reward_workers_scoring_is_its_reward_phase():
    worker = bare(RewardWorker, "reward")
    worker.setup("rule", run_config().reward, "digits")
    scores = worker.score([Scoring("1+1", "2", "2"), Scoring("1+1", "3", "2")])
    assert len(scores.rewards) == 2 and scores.extras == {}
    assert list(worker.memory_report()) == ["reward"]


def test_the_records_memory_keys_are_the_largest_over_a_roles_workers():
    mib = 1 << 20
    one = {"update": {"device_used": 2 * mib, "device_reserved": 4 * mib, "host_rss": 8 * mib}}
    two = {"update": {"device_used": 3 * mib, "device_reserved": 1 * mib, "host_rss": 8 * mib}}
    assert memory_metrics({"actor_train": [one, two]}) == {
        "memory/actor_train/update/device_used_mib": 3.0,
        "memory/actor_train/update/device_reserved_mib": 4.0,
        "memory/actor_train/update/host_rss_mib": 8.0,
    }


def test_only_the_known_phases_can_be_declared():
    assert PHASES == ("rollout", "logprobs", "update", "sync", "turns", "reward")
    with pytest.raises(ValueError, match="phase 'forward' is not one of rollout, logprobs"):
        phase("forward")


def test_on_the_simulated_npu_the_trace_is_labelled_simulated_and_ranges_reach_mstx(tmp_path):
    r = run_isolated("tests.tracking.sim_checks:step_profile", str(tmp_path))
    assert r["path"] == "actor_train_0.step3.simulated.json"
    assert r["label"] == {
        "role": "actor_train",
        "rank": 0,
        "step": 3,
        "platform": "npu (simulated)",
        "simulated": True,
    }
    assert r["ranges"] == ["update"]
    assert r["mstx"] == [["range_start", "update", 1], ["range_end", "", 1]]
    assert r["memory"]["update"]["device_used"] > 0
