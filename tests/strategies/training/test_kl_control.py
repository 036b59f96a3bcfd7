"""The adaptive KL coefficient against Ziegler et al. 2019 (arXiv 1909.08593, section 2.2):
e_t = clip((KL_t - KL_target) / KL_target, -0.2, 0.2), beta_{t+1} = beta_t (1 + K_beta e_t), with
K_beta = samples / horizon; and the KL it measures where the KL is in the reward."""

import pytest
import torch

from strategies.training.kl_control import adapted_kl_coef, reward_kl


def paper_beta(beta: float, kl: float, target: float, k_beta: float) -> float:
    error = (kl - target) / target
    error = max(-0.2, min(0.2, error))
    return beta * (1 + k_beta * error)


@pytest.mark.parametrize("kl", [0.0, 0.05, 0.1, 0.11, 0.3, 5.0])
def test_the_coefficient_follows_the_papers_controller(kl):
    # the paper's K_beta = 0.1: 256 samples over a horizon of 2560
    assert adapted_kl_coef(0.02, kl, 0.1, 256, 2560) == pytest.approx(paper_beta(0.02, kl, 0.1, 0.1))


def test_a_step_above_target_raises_the_coefficient_and_one_below_lowers_it():
    assert adapted_kl_coef(0.05, 0.2, 0.1, 64, 10000) > 0.05 > adapted_kl_coef(0.05, 0.01, 0.1, 64, 10000)
    assert adapted_kl_coef(0.05, 0.1, 0.1, 64, 10000) == 0.05  # on target: unchanged


def test_without_a_target_the_coefficient_is_fixed():
    assert adapted_kl_coef(0.05, 3.0, None, 64, 10000) == 0.05


def test_the_reward_kl_is_the_mean_of_each_rows_token_mean():
    old = torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    ref = torch.tensor([[0.0, -1.5, -2.0, 0.0], [0.0, -1.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]])  # the third row has no response
    # row 1: (0.5 + 0) / 2 = 0.25; row 2: 1.0 / 1 = 1.0; row 3 left out
    assert reward_kl(old, ref, mask) == pytest.approx((0.25 + 1.0) / 2)
    assert reward_kl(old, ref, torch.zeros_like(mask)) == 0.0
