"""The reference model inside the trainer's workers: when it is hosted (its devices, strategy and a
strategy that holds a second model in a process), and that a run with it hosted computes what a
run with the reference in workers of its own computes."""

import json

import pytest

from roll_device.cluster.inventory import Inventory, NodeInfo
from roll_device.commands.run import run_checked
from roll_device.pipeline.run_plan import build_run_plan
from tests.configs import run_config

HOST = Inventory((NodeInfo("h" * 56, "10.0.0.1", "head", cpus=2, is_head=True),))
GPUS = Inventory((NodeInfo("h" * 56, "10.0.0.1", "head", cpus=8, is_head=True, devices={"cuda": 4}),))


@pytest.mark.parametrize(
    "overrides, inventory, hosted",
    [
        ([], HOST, True),  # the default: FSDP, colocated on the trainer's device
        (["roles.reference.colocate_with=null"], HOST, False),  # devices of its own
        (["roles.actor_train.num_devices=2"], GPUS, False),  # one of the trainer's two devices
        (["roles.actor_train.num_devices=2", "roles.reference.num_devices=2"], GPUS, True),
        (["trainer=megatron"], GPUS, False),  # Megatron's parallel state is once per process
    ],
)
def test_which_references_run_in_the_trainers_workers(overrides, inventory, hosted):
    config = run_config(*overrides)
    assert bool(build_run_plan(config, inventory).hosted) is hosted


@pytest.mark.slow
def test_a_hosted_reference_computes_what_its_own_workers_compute(tmp_path):
    seen = {}

    def records(name, *overrides):
        def on_step(record, roles):
            seen[name] = (set(roles.groups), dict(roles.hosted))

        cfg = run_config("max_steps=3", "save_every=0", *overrides)
        run_dir = run_checked(cfg, tmp_path / name, on_step=on_step)
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    hosted = records("hosted")
    own = records("own", "roles.reference.colocate_with=null")
    assert seen["hosted"] == ({"actor_train", "actor_infer", "reward"}, {"reference": "actor_train"})
    assert seen["own"] == ({"actor_train", "actor_infer", "reward", "reference"}, {})
    assert hosted[-1]["kl"] > 0
    for key in ("kl", "loss", "reward_mean", "grad_norm"):
        assert [r[key] for r in hosted] == pytest.approx([r[key] for r in own], abs=1e-6), key
