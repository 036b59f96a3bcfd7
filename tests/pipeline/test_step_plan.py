"""The step plan line `roll-device plan` and `run` print (roll_device/pipeline/step_plan.py): a
recipe's sequences, optimizer steps and learning-rate schedule, as the run will take them."""

from roll_device.pipeline.step_plan import step_plan
from tests.configs import run_config


def test_the_default_step_is_one_optimizer_step_at_a_constant_rate():
    assert step_plan(run_config()) == (
        "step plan: grpo, 8 prompts x 8 samples = 64 sequences; 1 pass x 1 mini-batch = 1 optimizer step "
        "a step; lr 0.001, constant"
    )


def test_dapo_s_plan_names_its_rounds_its_mini_batches_and_the_cosine_s_span():
    config = run_config("algorithm=dapo", "trainer.lr_schedule=cosine", "trainer.min_lr_ratio=0.1")
    assert step_plan(config) == (
        "step plan: dapo, 8 prompts x 8 samples = 64 sequences (dynamic sampling: up to 10 rounds); 1 pass "
        "x 16 mini-batches = 16 optimizer steps a step; lr 0.001, cosine to 0.0001 over 480 optimizer steps"
    )


def test_ppo_s_plan_gives_the_critic_s_rate_beside_the_policy_s():
    config = run_config("algorithm=ppo", "algorithm.ppo_epochs=2", "critic.lr=1e-5", "trainer.warmup_steps=3")
    assert step_plan(config).endswith(
        "2 passes x 4 mini-batches = 8 optimizer steps a step; lr 0.001, 3 warmup steps, constant; "
        "critic lr 1e-05, 3 warmup steps, constant"
    )
