"""The colocated lifecycle on the simulated NPU (`cluster=sim`): an HF rollout on the trainer's
two NPUs sleeps while the FSDP2 trainer steps and wakes for the sync and the next rollout; the
trainer offloads while the engine generates. Each step's metrics report the device memory each
side gave back to the device, as the simulated NPU counts it (its cache keeps freed memory until
`empty_cache`, as torch_npu's allocator does; simulated: no real device memory is involved), and the
time the turns took (`swap_s`, part of `step_s`), each turn's span in the step's timeline."""

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
        # given back to the device (its free memory), not only freed into the caching allocator
        assert record["freed_bytes_actor_train"] > 0, "the trainer's offload gave the engine its memory"
        assert record["freed_bytes_actor_infer"] > 0, "the engine's sleep gave the trainer its memory"
        spans = record["timeline"]
        assert spans["for_rollout"][1] <= spans["rollout"][0], "the engine woke before it generated"
        # the trainer's reload comes after the reward (DAPO's refill rounds need the engines awake)
        # and before its first forward: inside the step's train span
        assert spans["rollout"][1] <= spans["reward"][1] <= spans["for_training"][0]
        assert spans["for_training"][1] <= spans["logprob"][0] <= spans["train"][1]
        assert spans["train"][1] <= spans["for_sync"][0] <= spans["for_sync"][1] <= spans["sync"][0]
        turns = sum(
            end - begin for begin, end in (spans[t] for t in ("for_rollout", "for_training", "for_sync"))
        )
        assert record["swap_s"] == pytest.approx(turns) and record["swap_s"] > 0
        parts = ("reward_s", "logprob_s", "train_s", "sync_s", "swap_s", "trainer_wait_s")
        assert record["step_s"] >= sum(record[part] for part in parts), "the turns are part of the step"
