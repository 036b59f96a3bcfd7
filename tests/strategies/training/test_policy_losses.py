"""The policy losses and their aggregation against the papers' objectives, written out here
(plain torch on the papers' definitions, not our functions), on random data: values and gradients;
the micro-batch split that must not change the global aggregation; the registry's refusals."""

from __future__ import annotations

import math

import pytest
import torch

from roll_device.errors import ConfigError
from strategies.base import TrainBatch
from strategies.training.losses import POLICY_LOSSES, LossSpec, policy_loss

B, T = 6, 5


def random_batch(seed: int = 0, per_token: bool = False):
    """Logprobs (with grad) near the old ones, and a batch with rows of several lengths, one all masked."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=gen) - 0.5
    logprobs = (old + 0.4 * torch.randn(B, T, generator=gen)).requires_grad_()
    lengths = torch.tensor([5, 3, 0, 1, 4, 2])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    shape = (B, T) if per_token else (B,)
    batch = TrainBatch(
        input_ids=torch.zeros(B, T, dtype=torch.long),
        attention_mask=torch.ones(B, T, dtype=torch.long),
        response_mask=mask,
        advantages=torch.randn(shape, generator=gen),
        old_logprobs=old,
        ref_logprobs=old - 0.1 * torch.rand(B, T, generator=gen),
    )
    return logprobs, batch


def rows(mask: torch.Tensor) -> list[int]:
    return [b for b in range(B) if mask[b].sum() > 0]


def token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 / sum_i |o_i| sum_i sum_t (DAPO's token-level loss, eq. 12)."""
    return sum(per_token[b, t] for b in range(B) for t in range(T) if mask[b, t]) / mask.sum()


def ours(logprobs, batch, **settings):
    loss, metrics = policy_loss(LossSpec(**settings))(logprobs, batch)
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss, grad, metrics


def theirs(logprobs, objective):
    loss = objective(logprobs)
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss, grad


def assert_same(got, expected):
    assert got[0].item() == pytest.approx(expected[0].item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(got[1], expected[1], atol=1e-6)


@pytest.mark.parametrize("high", [0.2, 0.28])
def test_ppo_clip_is_the_clipped_surrogate_token_mean(high):
    # PPO (arXiv 1707.06347), eq. 7, with DAPO's decoupled clip (arXiv 2503.14476, eq. 8)
    logprobs, batch = random_batch()
    mask, adv = batch.response_mask, batch.advantages

    def objective(lp):
        per_token = torch.zeros(B, T)
        for b in range(B):
            for t in range(T):
                r = torch.exp(lp[b, t] - batch.old_logprobs[b, t])
                per_token[b, t] = -torch.min(r * adv[b], torch.clamp(r, 0.8, 1 + high) * adv[b])
        return token_mean(per_token, mask)

    assert_same(ours(logprobs, batch, clip_ratio=0.2, clip_ratio_high=high)[:2], theirs(logprobs, objective))


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    # Dual-clip PPO (arXiv 1912.09729), eq. 5: for A < 0 the objective is max(min(r A, clip(r) A), c A)
    logprobs, batch = random_batch(seed=1)
    with torch.no_grad():
        logprobs += 1.5 * (batch.advantages < 0).float()[:, None]  # ratios far above c where A < 0
    mask, adv, c = batch.response_mask, batch.advantages, 3.0

    def objective(lp):
        per_token = torch.zeros(B, T)
        for b in range(B):
            for t in range(T):
                r = torch.exp(lp[b, t] - batch.old_logprobs[b, t])
                clipped = torch.min(r * adv[b], torch.clamp(r, 0.8, 1.2) * adv[b])
                per_token[b, t] = -(torch.max(clipped, c * adv[b]) if adv[b] < 0 else clipped)
        return token_mean(per_token, mask)

    got = ours(logprobs, batch, clip_ratio_c=c)
    assert_same(got[:2], theirs(logprobs, objective))
    assert got[0].item() != pytest.approx(ours(logprobs, batch)[0].item())  # the bound was reached


def test_gspo_clips_the_length_normalised_sequence_ratio():
    # GSPO (arXiv 2507.18071), eqs. 5-7: s_i = (pi / pi_old)^(1 / |y_i|), J = 1/G sum_i min(s_i A_i, clip(s_i) A_i)
    logprobs, batch = random_batch(seed=2)
    mask, adv = batch.response_mask, batch.advantages
    low, high = 0.05, 0.08

    def objective(lp):
        terms = []
        for b in rows(mask):
            n = int(mask[b].sum())
            s = torch.exp((lp[b, :n] - batch.old_logprobs[b, :n]).sum() / n)
            terms.append(-torch.min(s * adv[b], torch.clamp(s, 1 - low, 1 + high) * adv[b]))
        return sum(terms) / len(terms)

    got = ours(
        logprobs, batch, name="gspo", clip_ratio=low, clip_ratio_high=high, loss_agg="seq-mean-token-mean"
    )
    assert_same(got[:2], theirs(logprobs, objective))


def test_cispo_weighs_the_log_likelihood_by_the_clipped_stopped_ratio():
    # CISPO (MiniMax-M1, arXiv 2506.13585), eq. 4: J = 1 / sum|o_i| sum_i sum_t sg(r_hat_it) A_it log pi_it
    logprobs, batch = random_batch(seed=3)
    mask, adv = batch.response_mask, batch.advantages

    def objective(lp):
        per_token = torch.zeros(B, T)
        for b in range(B):
            for t in range(T):
                r_hat = torch.clamp(torch.exp(lp[b, t] - batch.old_logprobs[b, t]), 0.8, 1.28).detach()
                per_token[b, t] = -r_hat * adv[b] * lp[b, t]
        return token_mean(per_token, mask)

    assert_same(ours(logprobs, batch, name="cispo", clip_ratio_high=0.28)[:2], theirs(logprobs, objective))


def per_row_surrogate(lp, batch) -> torch.Tensor:
    r = torch.exp(lp - batch.old_logprobs)
    adv = batch.advantages[:, None]
    return -torch.min(r * adv, torch.clamp(r, 0.8, 1.2) * adv)


@pytest.mark.parametrize(
    "mode, reduce_row",
    [
        ("seq-mean-token-mean", lambda values, n: values.sum() / n),
        ("seq-mean-token-sum", lambda values, n: values.sum()),
        ("seq-mean-token-sum-norm", lambda values, n: values.sum() / 7),  # Dr. GRPO: over the budget, 7
    ],
)
def test_the_seq_mean_aggregations_average_rows_with_a_response(mode, reduce_row):
    logprobs, batch = random_batch(seed=4)
    mask = batch.response_mask

    def objective(lp):
        per_token = per_row_surrogate(lp, batch)
        means = [reduce_row(per_token[b, : int(mask[b].sum())], int(mask[b].sum())) for b in rows(mask)]
        return sum(means) / len(means)  # the all-masked row is not a row of the mean

    got = ours(logprobs, batch, loss_agg=mode, max_response_tokens=7)
    assert_same(got[:2], theirs(logprobs, objective))


def test_token_level_advantages_broadcast_per_token():
    logprobs, batch = random_batch(seed=5, per_token=True)
    mask, adv = batch.response_mask, batch.advantages

    def objective(lp):
        r = torch.exp(lp - batch.old_logprobs)
        return token_mean(-torch.min(r * adv, torch.clamp(r, 0.8, 1.2) * adv), mask)

    assert_same(ours(logprobs, batch)[:2], theirs(logprobs, objective))


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
@pytest.mark.parametrize("name", ["ppo_clip", "gspo"])
def test_a_micro_batch_split_does_not_change_the_global_aggregation(name, mode):
    # The trainer weighs each micro-batch loss by its `units` over the step's (StepAccounting)
    logprobs, batch = random_batch(seed=6)
    loss_fn = policy_loss(LossSpec(name, kl_coef=0.05, loss_agg=mode))
    whole, _ = loss_fn(logprobs, batch)
    total = loss_fn.units(batch.response_mask)
    split = sum(
        loss_fn(logprobs[part], batch.select(part))[0] * loss_fn.units(batch.response_mask[part]) / total
        for part in (slice(0, 2), slice(2, 3), slice(3, 6))  # the middle one is the all-masked row
    )
    assert split.item() == pytest.approx(whole.item(), rel=1e-5)


def test_an_empty_batch_row_adds_nothing():
    logprobs, batch = random_batch(seed=7)
    loss, grad, _ = ours(logprobs, batch, loss_agg="seq-mean-token-mean")
    assert torch.isfinite(loss)
    assert grad[2].abs().sum() == 0  # the all-masked row


def test_unknown_loss_and_aggregation_are_refused_with_the_choices():
    with pytest.raises(
        ConfigError,
        match="algorithm.policy_loss=sapo: unknown policy loss, choose one of cispo, gspo, ppo_clip",
    ):
        policy_loss(LossSpec("sapo"))
    with pytest.raises(
        ConfigError, match="algorithm.loss_agg='sum': choose one of token-mean, seq-mean-token-mean"
    ):
        policy_loss(LossSpec(loss_agg="sum"))
    with pytest.raises(ConfigError, match="clip_ratio_c must be > 1"):
        policy_loss(LossSpec(clip_ratio_c=0.5))


def test_a_different_loss_under_a_taken_name_is_refused():
    with pytest.raises(
        ValueError, match="policy loss 'gspo' is already registered as strategies.training.losses:gspo"
    ):
        POLICY_LOSSES.register("gspo", "mine:gspo")


@pytest.mark.parametrize(
    "estimator, formula",
    [  # Schulman, "Approximating KL Divergence" (2020): r = pi_ref / pi, k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r
        ("k1", lambda r: -math.log(r)),
        ("k2", lambda r: math.log(r) ** 2 / 2),
        ("k3", lambda r: (r - 1) - math.log(r)),
        ("low_var_kl", lambda r: min((r - 1) - math.log(r), 10.0)),
    ],
)
def test_the_kl_term_is_the_chosen_estimator_aggregated_like_the_loss(estimator, formula):
    logprobs, batch = random_batch(seed=8)
    with torch.no_grad():
        batch.ref_logprobs[0, 0] = logprobs[0, 0] + 3.0  # a large ratio, which low_var_kl clamps
    mask = batch.response_mask
    expected = token_mean(
        torch.tensor(
            [
                [formula(math.exp(batch.ref_logprobs[b, t] - logprobs.detach()[b, t])) for t in range(T)]
                for b in range(B)
            ]
        ),
        mask,
    )
    _, metrics = policy_loss(LossSpec(kl_coef=0.1, kl_estimator=estimator))(logprobs, batch)
    assert metrics["kl"] == pytest.approx(expected.item(), rel=1e-5)


def test_the_entropy_bonus_is_ppos_c2_entropy_term():
    # PPO (arXiv 1707.06347), eq. 9: maximise L_clip + c2 S[pi]; as a loss, -L_clip - c2 S, with S
    # aggregated like the surrogate (token-mean here), its gradient flowing into the entropy
    logprobs, batch = random_batch(3)
    entropy = torch.rand(B, T, generator=torch.Generator().manual_seed(4)).requires_grad_()
    mask, adv = batch.response_mask, batch.advantages
    loss_fn = policy_loss(LossSpec(entropy_coef=0.05))
    assert loss_fn.needs_entropy and not policy_loss(LossSpec()).needs_entropy
    loss, _ = loss_fn(logprobs, batch, entropy)
    grads = torch.autograd.grad(loss, (logprobs, entropy))

    def objective(lp, ent):
        per_token = torch.zeros(B, T)
        for b in range(B):
            for t in range(T):
                r = torch.exp(lp[b, t] - batch.old_logprobs[b, t])
                per_token[b, t] = -torch.min(r * adv[b], torch.clamp(r, 0.8, 1.2) * adv[b])
        return token_mean(per_token, mask) - 0.05 * token_mean(ent, mask)

    expected = objective(logprobs, entropy)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for got, want in zip(grads, torch.autograd.grad(expected, (logprobs, entropy))):
        assert torch.allclose(got, want, atol=1e-6)
