"""A reward model (`roles.reward.strategy=model`) in a whole run: the reward of each of the run's
own responses is what the model was built to score, as a rule computing the same thing gives it."""

import pytest

from roll_device.commands.run import run_checked
from roll_device.pipeline.generations import GenerationsLog
from roll_device.pipeline.metrics import MetricsLog
from tests.configs import run_config
from tests.inputs.reward_models import make_last_digit_reward_model
from tests.pipeline.user_rewards import last_digit


def rewards(run_dir) -> list[float]:
    return [record["reward_mean"] for record in MetricsLog(run_dir).steps()]


def test_a_reward_models_rewards_equal_the_rule_it_computes(tmp_path, shared_cluster):
    """Each response's reward from the model is the rule's (user_rewards.last_digit) on its text, as
    generations.jsonl shows them (the run's 64 responses)."""
    model = make_last_digit_reward_model(tmp_path / "rm")
    overrides = [*shared_cluster, "max_steps=1", "save_every=0", "algorithm.kl_coef=0", "rollout=hf"]
    reward_model = ["roles.reward.strategy=model", f"reward.model_path={model}", "tracking.generations=64"]
    run_dir = run_checked(run_config(*overrides, *reward_model), tmp_path / "run")
    lines = GenerationsLog(run_dir).read()
    by_rule = [last_digit(line["prompt"], line["response"], line["answer"]) for line in lines]
    assert len(lines) == 64 and 0 < sum(by_rule) < 64, "some responses end with a digit, some do not"
    assert [line["reward"] for line in lines] == pytest.approx(by_rule, abs=1e-6)


@pytest.mark.slow
def test_a_policy_learns_what_the_reward_model_prefers(tmp_path, shared_cluster):
    model = make_last_digit_reward_model(tmp_path / "rm")
    overrides = [*shared_cluster, "max_steps=30", "save_every=0", "roles.reward.strategy=model"]
    run_dir = run_checked(run_config(*overrides, f"reward.model_path={model}"), tmp_path / "run")
    got = rewards(run_dir)
    assert sum(got[-3:]) / 3 > sum(got[:3]) / 3 + 0.3, got


@pytest.mark.slow
def test_a_reward_model_on_a_simulated_npu(tmp_path):
    """SIMULATED: the reward model on the sim cluster's NPU node, beside the trainer's two NPUs."""
    seen = {}

    def on_step(record, roles):
        seen["record"], seen["infos"] = record, roles.groups["reward"].infos

    model = make_last_digit_reward_model(tmp_path / "rm")
    overrides = ["experiment=mixed_devices", "cluster=sim", "max_steps=1", "roles.reward.device=npu"]
    cfg = run_config(*overrides, "roles.reward.strategy=model", f"reward.model_path={model}")
    run_checked(cfg, tmp_path / "run", on_step=on_step)
    assert [(i["kind"], i["node_name"], i["device"]) for i in seen["infos"]] == [("npu", "npu-node", "npu:0")]
    assert seen["record"]["memory/reward/reward/device_used_mib"] > 0, "its weights on the device"
