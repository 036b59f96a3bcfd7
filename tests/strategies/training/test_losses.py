"""The policy losses and advantages, against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from roll_device.errors import ConfigError
from strategies.base import TrainBatch
from strategies.training.losses import grpo_policy_loss, masked_mean, nll_loss


def batch(advantages, old, ref=None, mask=None) -> TrainBatch:
    old = torch.tensor(old)
    return TrainBatch(
        input_ids=torch.zeros(old.shape, dtype=torch.long),
        attention_mask=torch.ones(old.shape, dtype=torch.long),
        response_mask=torch.ones(old.shape) if mask is None else torch.tensor(mask),
        advantages=torch.tensor(advantages),
        old_logprobs=old,
        ref_logprobs=None if ref is None else torch.tensor(ref),
    )


def test_unclipped_ratio_gives_minus_ratio_times_advantage():
    logprobs = torch.tensor([[math.log(1.1)]], requires_grad=True)
    loss, metrics = grpo_policy_loss(clip_ratio=0.2)(logprobs, batch([2.0], [[0.0]]))
    assert loss.item() == pytest.approx(-2.2)
    assert metrics["clip_fraction"] == 0.0
    loss.backward()
    assert logprobs.grad.item() == pytest.approx(-2.2)  # d(-A * e^x)/dx


def test_ratio_above_the_clip_range_with_positive_advantage_has_no_gradient():
    logprobs = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, metrics = grpo_policy_loss(clip_ratio=0.2)(logprobs, batch([1.0], [[0.0]]))
    assert loss.item() == pytest.approx(-1.2)
    assert metrics["clip_fraction"] == 1.0
    loss.backward()
    assert logprobs.grad.item() == 0.0


def test_negative_advantage_keeps_the_pessimistic_unclipped_term():
    logprobs = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, _ = grpo_policy_loss(clip_ratio=0.2)(logprobs, batch([-1.0], [[0.0]]))
    assert loss.item() == pytest.approx(1.5)


def test_asymmetric_upper_clip():
    logprobs = torch.tensor([[math.log(1.5)]])
    loss, _ = grpo_policy_loss(clip_ratio=0.2, clip_ratio_high=0.28)(logprobs, batch([1.0], [[0.0]]))
    assert loss.item() == pytest.approx(-1.28)


def test_token_mean_over_the_response_mask_only():
    logprobs = torch.zeros(1, 3)
    loss, _ = grpo_policy_loss()(logprobs, batch([1.0], [[0.0, 0.0, 5.0]], mask=[[1.0, 1.0, 0.0]]))
    assert loss.item() == pytest.approx(-1.0)  # the masked token (ratio e^-5) is ignored


def test_kl_penalty_is_the_k3_estimator():
    logprobs = torch.tensor([[0.0, 0.0]])
    ref = [[math.log(2.0), 0.0]]
    loss, metrics = grpo_policy_loss(kl_coef=0.5)(logprobs, batch([0.0], [[0.0, 0.0]], ref=ref))
    expected_kl = ((2.0 - math.log(2.0) - 1.0) + 0.0) / 2
    assert metrics["kl"] == pytest.approx(expected_kl)
    assert loss.item() == pytest.approx(0.5 * expected_kl)


def test_without_old_logprobs_the_step_is_on_policy():
    logprobs = torch.tensor([[-1.0]], requires_grad=True)
    b = batch([3.0], [[0.0]])
    b.old_logprobs = None
    loss, metrics = grpo_policy_loss()(logprobs, b)
    loss.backward()
    assert (loss.item(), metrics["ratio_mean"], logprobs.grad.item()) == pytest.approx((-3.0, 1.0, -3.0))


def test_nll_loss_and_masked_mean():
    logprobs = torch.tensor([[-1.0, -3.0, -7.0]])
    loss, _ = nll_loss()(logprobs, batch([0.0], [[0.0] * 3], mask=[[1.0, 1.0, 0.0]]))
    assert loss.item() == pytest.approx(2.0)
    assert masked_mean(torch.ones(2), torch.zeros(2)).item() == 0.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"clip_ratio": 0.0}, "clip_ratio must be in"),
        ({"kl_coef": -1.0}, "kl_coef and entropy_coef must be >= 0"),
    ],
)
def test_bad_loss_settings(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        grpo_policy_loss(**kwargs)


def test_missing_fields_are_named():
    b = batch([1.0], [[0.0]])
    with pytest.raises(ConfigError, match="needs TrainBatch.ref_logprobs"):
        grpo_policy_loss(kl_coef=0.1)(torch.zeros(1, 1), b)
    b.advantages = None
    with pytest.raises(ConfigError, match="needs TrainBatch.advantages"):
        grpo_policy_loss()(torch.zeros(1, 1), b)
