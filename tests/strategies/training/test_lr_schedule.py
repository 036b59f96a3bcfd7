"""The trainers' learning-rate schedule (`trainer.warmup_steps`, `lr_schedule`, `min_lr_ratio`,
`schedule_steps`; strategies/training/settings.py's `lr_factor`, which the FSDP2 trainer's LambdaLR
and the Megatron trainer's optimizer take): the cosine against SGDR's eq. 5 written out, and the
span a run gives it."""

import math

import pytest

from benchmarks.configs import trainer_settings
from tests.configs import run_config


def sgdr(eta_max: float, eta_min: float, t_cur: float, t_i: float) -> float:
    """Loshchilov and Hutter, arXiv 1608.03983, eq. 5: eta_min + (eta_max - eta_min) (1 + cos(pi T_cur / T_i)) / 2."""
    return eta_min + 0.5 * (eta_max - eta_min) * (1 + math.cos(math.pi * t_cur / t_i))


@pytest.mark.parametrize("trainer", ["fsdp", "megatron"])
def test_the_cosine_is_sgdr_s_after_a_linear_warmup_and_stays_at_its_floor(trainer):
    lr, warmup, steps, floor = 1e-3, 3, 20, 0.1
    settings = trainer_settings(
        trainer, lr=lr, warmup_steps=warmup, lr_schedule="cosine", min_lr_ratio=floor, schedule_steps=steps
    )
    rates = [lr * settings.lr_factor(step) for step in range(steps + 5)]
    assert rates[:warmup] == pytest.approx([lr / 3, 2 * lr / 3, lr])
    expected = [sgdr(lr, floor * lr, step - warmup, steps - warmup) for step in range(warmup, steps)]
    assert rates[warmup:steps] == pytest.approx(expected)
    assert rates[steps:] == pytest.approx([floor * lr] * 5), "after its span the rate stays at the floor"


def test_the_constant_schedule_is_the_warmup_then_lr():
    settings = trainer_settings(warmup_steps=2, lr_schedule="constant")
    assert [settings.lr_factor(step) for step in range(4)] == [0.5, 1.0, 1.0, 1.0]


def test_a_run_s_cosine_spans_its_optimizer_steps_unless_told_otherwise():
    """max_steps x ppo_epochs x mini_batches, for the policy and PPO's critic alike."""
    config = run_config(
        "trainer.lr_schedule=cosine",
        "max_steps=3",
        "algorithm=ppo",
        "algorithm.ppo_epochs=2",
        "algorithm.mini_batches=4",
    )
    assert config.trainer.schedule_steps is None
    assert [config.strategy_settings(role).schedule_steps for role in ("actor_train", "critic")] == [24, 24]
    assert config.strategy_settings("critic").lr == config.critic.lr
    told = run_config("trainer.lr_schedule=cosine", "trainer.schedule_steps=100")
    assert told.strategy_settings("actor_train").schedule_steps == 100
    assert run_config().strategy_settings("actor_train").schedule_steps is None, "constant: no span needed"
