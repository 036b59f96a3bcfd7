"""PPO's critic (strategies/training/critic.py): the clipped value loss against PPO's formula,
written out here element by element; the FSDP2 value model in this process on the tiny model (one
gloo rank): its values, a training step that lowers the loss, its checkpoint round trip."""

from __future__ import annotations

import pytest
import torch

import roll_device as rd
from strategies.base import NonFiniteUpdateError, TrainBatch
from strategies.registry import strategy_class
from strategies.training.critic import FsdpCriticStrategy, explained_variance, value_loss
from strategies.training.hf_weights import HfWeights
from tests.configs import trainer_settings
from tests.strategies.training.data import fixed_batch

CLIP = 0.2


def test_the_value_loss_is_ppos_clipped_squared_error():
    """L = 1/2 mean over response tokens of max((V - R)^2, (V_old + clip(V - V_old, -e, e) - R)^2)."""
    gen = torch.Generator().manual_seed(0)
    values, old, returns = (torch.randn(3, 5, generator=gen) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.float)
    batch = TrainBatch(
        torch.zeros(3, 5, dtype=torch.long), torch.ones(3, 5), mask, values=old, returns=returns
    )
    terms, clipped = [], []
    for row, t in zip(*torch.nonzero(mask, as_tuple=True)):
        v, v_old, r = float(values[row, t]), float(old[row, t]), float(returns[row, t])
        v_clipped = min(max(v, v_old - CLIP), v_old + CLIP)
        terms.append(max((v - r) ** 2, (v_clipped - r) ** 2))
        clipped.append((v_clipped - r) ** 2 > (v - r) ** 2)
    loss, metrics = value_loss(CLIP)(values, batch)
    assert loss.item() == pytest.approx(0.5 * sum(terms) / len(terms), rel=1e-6)
    assert metrics["value_clipfrac"] == pytest.approx(sum(clipped) / len(clipped))
    assert 0 < metrics["value_clipfrac"] < 1  # the data has both cases


def test_explained_variance_is_one_minus_the_residuals_share():
    gen = torch.Generator().manual_seed(1)
    returns, values = torch.randn(2, 6, generator=gen), torch.randn(2, 6, generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.float)
    picked = mask.bool()
    expected = 1 - (returns - values)[picked].var(unbiased=False) / returns[picked].var(unbiased=False)
    assert explained_variance(values, returns, mask) == pytest.approx(expected.item(), rel=1e-5)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)


def test_registered_for_every_kind():
    for kind in ("cuda", "rocm", "npu", "cpu"):
        assert strategy_class("critic", "fsdp", kind) is FsdpCriticStrategy


@pytest.fixture(scope="module")
def critic_run(tiny_model_path, tmp_path_factory):
    """One critic in this process: its first values, five steps towards a fixed target, and a
    step after a save and again after loading that save."""
    critic = FsdpCriticStrategy(rd.get_platform("cpu"))
    critic.initialize(tiny_model_path, trainer_settings("fsdp", lr=1e-3))
    try:
        batch = fixed_batch()
        out = {"first_values": critic.forward_values(batch), "mask": batch.response_mask}
        out["backbone_equal"] = torch.equal(
            critic.model.state_dict()["model.embed_tokens.weight"].full_tensor(),
            HfWeights(tiny_model_path)["model.embed_tokens.weight"],
        )
        losses = []
        for _ in range(5):
            batch.values = critic.forward_values(batch)
            losses.append(critic.train_values(batch, CLIP)["loss"])
        out["losses"] = losses
        checkpoint = str(tmp_path_factory.mktemp("critic-checkpoint"))
        critic.save_checkpoint(checkpoint)
        out["after_save"] = critic.train_values(batch, CLIP)["loss"], critic.forward_values(batch)
        critic.load_checkpoint(checkpoint)
        out["after_load"] = critic.train_values(batch, CLIP)["loss"], critic.forward_values(batch)
        batch.returns = torch.full_like(batch.returns, float("nan"))
        with pytest.raises(NonFiniteUpdateError) as refused:
            critic.train_values(batch, CLIP)
        out["refused"] = str(refused.value)
        return out
    finally:
        critic.shutdown()


def test_the_critic_starts_from_the_policys_backbone_with_a_zero_head(critic_run):
    assert critic_run["backbone_equal"]
    values = critic_run["first_values"]
    assert values.shape == (4, 10) and values.abs().max() == 0


def test_value_steps_lower_the_value_loss_on_a_fixed_target(critic_run):
    losses = critic_run["losses"]
    assert losses[0] == pytest.approx(0.5)  # values 0, returns 1: 1/2 (0 - 1)^2
    assert losses[-1] < 0.5 * losses[0], losses


def test_the_critics_checkpoint_round_trip_gives_the_same_next_step(critic_run):
    (loss_saved, values_saved), (loss_loaded, values_loaded) = (
        critic_run["after_save"],
        critic_run["after_load"],
    )
    assert loss_loaded == pytest.approx(loss_saved, rel=1e-6)
    assert torch.allclose(values_loaded, values_saved, atol=1e-6)
    mask = critic_run["mask"]
    assert values_loaded[mask == 0].abs().max() == 0 and values_loaded[mask > 0].abs().min() > 0


def test_a_critic_update_that_is_not_finite_is_refused_in_its_own_words(critic_run):
    assert critic_run["refused"].startswith("the critic's value update was not applied: its loss is nan")


def test_a_critic_of_a_mixture_of_experts_steps_with_the_policys_routing_settings(tiny_moe_path):
    """transformers' token-classification output of an MoE carries no load-balancing loss: the
    critic takes the trainer's section (router_aux_loss_coef set, as experiment=moe sets it) and
    trains by the value loss alone."""
    critic = FsdpCriticStrategy(rd.get_platform("cpu"))
    critic.initialize(tiny_moe_path, trainer_settings("fsdp", lr=1e-3, router_aux_loss_coef=0.001))
    try:
        batch = fixed_batch()
        losses = []
        for _ in range(3):
            batch.values = critic.forward_values(batch)
            metrics = critic.train_values(batch, CLIP)
            losses.append(metrics["loss"])
        assert "router_aux_loss" not in metrics
        assert losses[-1] < losses[0], losses
    finally:
        critic.shutdown()
