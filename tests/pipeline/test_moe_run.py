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
