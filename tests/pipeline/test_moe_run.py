"""`experiment=moe`: GRPO on the tiny Qwen3-MoE (FSDP2 trainer, HF engine, a weight sync each
step) raises the digits task's reward on the CPU, with the router's metrics in every record."""

import json

import pytest

from roll_device.commands.run import run_checked
from tests.configs import run_config


@pytest.mark.slow
def test_the_moe_experiment_raises_the_reward_in_30_steps(tmp_path, shared_cluster):
    config = run_config(*shared_cluster, "experiment=moe", "max_steps=30", "save_every=0")
    run_dir = run_checked(config, tmp_path / "run")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in records]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.05, f"reward did not rise: {rewards}"
    for record in records:
        assert record["weights_version"] == record["step"]
        assert 1.0 <= record["expert_imbalance"] <= 4.0 and record["router_aux_loss"] > 1.9


@pytest.mark.slow
def test_routing_replay_runs_with_the_hf_engines_routes(tmp_path, shared_cluster):
    """The HF engine records routes, the batch carries them to the FSDP2 trainer, which replays them:
    in fp32 on both sides the trainer's logprobs are the sampler's."""
    overrides = ["experiment=moe", "rollout=hf", "trainer.routing_replay=true", "max_steps=3", "save_every=0"]
    run_dir = run_checked(run_config(*shared_cluster, *overrides), tmp_path / "run")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert record["rollout_vs_train_logprob_gap"] < 1e-4
