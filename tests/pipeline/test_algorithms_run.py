"""The recipes other than GRPO, run for real (Ray, an HF rollout, the FSDP2 trainer): DAPO's
2 steps by default (its dynamic sampling samples more rounds until the batch is full and reports
the rounds and the dropped groups, its clip-higher loss trains without a reference role); every
recipe 30 steps with rising reward among the slow tests."""

import json

import pytest

from roll_device.commands.run import run_checked
from tests.configs import run_config

RECIPES = ("dapo", "dr_grpo", "gspo", "rloo", "reinforce_pp")


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_dapo_runs_two_steps_and_reports_its_dropped_groups(tmp_path, shared_cluster):
    config = run_config(*shared_cluster, "algorithm=dapo", "rollout=hf", "max_steps=2", "save_every=0")
    records = _records(run_checked(config, tmp_path / "run"))
    assert [(r["step"], r["weights_version"]) for r in records] == [(1, 1), (2, 2)]
    prompts, rounds = config.data.prompts_per_step, config.algorithm.max_sampling_rounds
    for record in records:
        assert 1 <= record["sampling_rounds"] <= rounds and record["refill_s"] >= 0
        if record["sampling_rounds"] < rounds:  # full: the step trains on one step's groups
            assert record["dropped_groups"] == (record["sampling_rounds"] - 1) * prompts
        assert record["kl"] == 0.0, "DAPO has no KL term (no reference role)"
        assert record["grad_norm"] == record["grad_norm"], "a finite update"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_raises_the_tiny_task_s_reward_in_30_steps(tmp_path, shared_cluster, recipe):
    config = run_config(*shared_cluster, f"algorithm={recipe}", "rollout=hf", "max_steps=30", "save_every=0")
    rewards = [r["reward_mean"] for r in _records(run_checked(config, tmp_path / "run"))]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.05, f"{recipe}: reward did not rise: {rewards}"
