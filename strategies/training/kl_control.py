"""The KL coefficient of a step: fixed (`algorithm.kl_target=null`), or adapted toward a target KL
after every step by the proportional controller of Ziegler et al. 2019 ("Fine-Tuning Language
Models from Human Preferences", arXiv 1909.08593, section 2.2):

    e_t = clip(KL_t / KL_target - 1, -0.2, 0.2),    beta_{t+1} = beta_t (1 + K_beta e_t)

with K_beta = n / horizon for a step of n samples (verl's `AdaptiveKLController`; the paper's
K_beta = 0.1 is n / horizon = 0.1). KL_t is the step's measured KL to the reference: the loss's
estimate where the KL is in the loss, the mean k1 (old - ref) over each row's response tokens,
averaged over rows, where it is in the reward.
"""

from __future__ import annotations

import torch

ERROR_CLIP = 0.2  # the paper's clip of the proportional error


def adapted_kl_coef(
    coef: float, measured_kl: float, target: float | None, samples: int, horizon: int
) -> float:
    """The next step's coefficient after a step of `samples` samples that measured `measured_kl`;
    `coef` unchanged when `target` is None (a fixed coefficient)."""
    if target is None:
        return coef
    error = min(max(measured_kl / target - 1.0, -ERROR_CLIP), ERROR_CLIP)
    return coef * (1.0 + error * samples / horizon)


def reward_kl(old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean over rows of each row's mean k1 = old - ref over its response tokens (rows
    without one left out): the KL that `kl_in_reward` takes off the rewards, per token."""
    mask = mask.float()
    tokens = mask.sum(dim=1)
    per_row = ((old_logprobs - ref_logprobs).float() * mask).sum(dim=1) / tokens.clamp(min=1.0)
    rows = tokens > 0
    return per_row[rows].mean().item() if rows.any() else 0.0
