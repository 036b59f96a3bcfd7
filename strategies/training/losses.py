"""Loss functions for the RL pipeline: the GRPO/PPO clipped policy loss with an optional KL
penalty to the reference policy, a supervised (NLL) loss, and group-normalized advantages.

A loss function has the trainer signature `loss_fn(logprobs, batch) -> (loss, metrics)`: `logprobs`
is (B, T) with grad, aligned with `batch.input_ids`; the loss is the mean over response tokens
(`batch.response_mask`).
"""

from __future__ import annotations

import torch

from roll_device.errors import ConfigError
from strategies.base import LossFn, TrainBatch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 when the mask is empty."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def grpo_policy_loss(
    clip_ratio: float = 0.2, kl_coef: float = 0.0, clip_ratio_high: float | None = None
) -> LossFn:
    """The PPO clipped surrogate (GRPO uses it with group-normalized advantages), token-mean.

    ratio = exp(logprobs - old_logprobs); per token: -min(ratio * A, clip(ratio, 1 - clip_ratio,
    1 + clip_ratio_high) * A). With `kl_coef` > 0 the k3 estimator of KL(policy || reference),
    exp(ref - logp) - (ref - logp) - 1, is added with that weight. Without `old_logprobs` the step
    is on-policy (ratio 1 with the gradient of the plain policy gradient).
    """
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if not 0 < clip_ratio < 1 or high <= 0:
        raise ConfigError(
            f"grpo_policy_loss: clip_ratio must be in (0, 1) and clip_ratio_high > 0, got "
            f"{clip_ratio} and {clip_ratio_high} (0.2 is the usual value)"
        )
    if kl_coef < 0:
        raise ConfigError(f"grpo_policy_loss: kl_coef must be >= 0, got {kl_coef}")

    def loss_fn(logprobs: torch.Tensor, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        if batch.advantages is None:
            raise ConfigError("grpo_policy_loss needs TrainBatch.advantages (one value per row)")
        if kl_coef > 0 and batch.ref_logprobs is None:
            raise ConfigError(
                f"grpo_policy_loss with kl_coef={kl_coef} needs TrainBatch.ref_logprobs "
                "(reference logprobs), or set kl_coef=0"
            )
        device = logprobs.device
        mask = batch.response_mask.to(device, logprobs.dtype)
        old = (
            batch.old_logprobs.to(device, logprobs.dtype)
            if batch.old_logprobs is not None
            else logprobs.detach()
        )
        advantages = batch.advantages.to(device, logprobs.dtype).unsqueeze(1)
        ratio = torch.exp(logprobs - old)
        unclipped = ratio * advantages
        clipped = torch.clamp(ratio, 1 - clip_ratio, 1 + high) * advantages
        policy_loss = masked_mean(-torch.minimum(unclipped, clipped), mask)
        loss = policy_loss
        metrics = {
            "policy_loss": policy_loss.item(),
            "clip_fraction": masked_mean((clipped < unclipped).to(logprobs.dtype), mask).item(),
            "ratio_mean": masked_mean(ratio.detach(), mask).item(),
        }
        if kl_coef > 0:
            delta = batch.ref_logprobs.to(device, logprobs.dtype) - logprobs
            kl = masked_mean(torch.exp(delta) - delta - 1, mask)
            loss = loss + kl_coef * kl
            metrics["kl"] = kl.item()
        return loss, metrics

    return loss_fn


def nll_loss() -> LossFn:
    """Supervised loss: the negative log-likelihood of the response tokens, token-mean."""

    def loss_fn(logprobs: torch.Tensor, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return masked_mean(-logprobs, batch.response_mask.to(logprobs.device)), {}

    return loss_fn


def group_normalized_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages: each reward minus its group's mean, over the group's std (+ eps).

    `rewards` is (N,) in prompt-major order: rows [g * group_size, (g + 1) * group_size) answer
    the same prompt.
    """
    if group_size < 1 or rewards.dim() != 1 or rewards.numel() % group_size:
        raise ConfigError(
            f"group_normalized_advantages: {tuple(rewards.shape)} rewards do not split into groups "
            f"of {group_size}: pass a 1-D tensor whose length is a multiple of the samples per prompt"
        )
    groups = rewards.float().view(-1, group_size)
    std = (
        groups.std(dim=1, keepdim=True, unbiased=False) if group_size > 1 else torch.zeros_like(groups[:, :1])
    )
    return ((groups - groups.mean(dim=1, keepdim=True)) / (std + eps)).view(-1)
