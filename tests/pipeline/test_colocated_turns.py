"""The colocated lifecycle on the simulated NPU (`cluster=sim`): an HF rollout on the trainer's
two NPUs sleeps while the FSDP2 trainer steps and wakes for the sync and the next rollout; the
trainer offloads while the engine generates. Each step's metrics report the device memory each
side freed, as the simulated NPU counts it (simulated: no real device memory is involved)."""

import pytest

from roll_device.commands.run import run_checked
from tests.configs import run_config


@pytest.mark.slow
def test_colocated_engine_and_trainer_take_turns_on_the_devices(tmp_path):
    records = []
    cfg = run_config(
        "experiment=mixed_devices",
        "cluster=sim",
        "max_steps=2",
        "rollout=hf",
        "roles.actor_infer.device=npu",
        "roles.actor_infer.colocate_with=actor_train",
        "algorithm.max_staleness=0",  # the experiment overlaps its two sides; colocated ones take turns
    )
    run_checked(cfg, tmp_path / "run", on_step=lambda record, roles: records.append(record))
    assert [(r["step"], r["weights_version"], r["sync_path"]) for r in records] == [
        (1, 1, "colocated"),
        (2, 2, "colocated"),
    ]
    for record in records:
        assert record["freed_bytes_actor_train"] > 0, "the trainer offloaded while the engine generated"
        assert record["freed_bytes_actor_infer"] > 0, "the engine slept while the trainer stepped"
