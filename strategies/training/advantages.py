"""The advantage estimators, by name (`algorithm.advantage`), and the reward shaping around them.

An estimator is `estimator(inputs: AdvantageInputs, settings: AdvantageSpec) -> Tensor`: one
advantage per row (N,) or per token (N, T), computed on the driver from the step's scores
(prompt-major: rows [g * G, (g + 1) * G) answer one prompt) and, for the token-level ones, the
trainer's and the reference's logprobs. With `kl_in_reward` the KL penalty k1 = old - ref, times
`kl_coef`, is taken off each response token's reward (the loss then has none), as
REINFORCE++ does; the sequence-level estimators see the sum over the row.

- `grpo` (DeepSeekMath, arXiv 2402.03300): (r - group mean) / (group std + eps); the std is the
  unbiased one by default (verl's and TRL's convention), `std_unbiased=false` the biased one;
  `norm_std=false` leaves the centred rewards (Dr. GRPO, arXiv 2503.20783).
- `rloo` (arXiv 2402.14740): r minus the mean of the group's other rewards.
- `reinforce_pp` (REINFORCE++, arXiv 2501.03262): each token's return (the sum of its own and the
  later tokens' rewards), normalised over every response token of the batch.
- `reinforce_pp_baseline`: r minus the group mean, normalised over the batch's response tokens.
- `gae` (Schulman et al., arXiv 1506.02438, eq. 16): from the critic's values V_t of the response
  tokens, delta_t = r_t + gamma V_{t+1} - V_t (V after the last response token is 0) and
  A_t = sum_l (gamma lam)^l delta_{t+l}, with the token rewards above; the critic's targets are the
  returns A_t + V_t (`gae_returns`); the advantages are whitened over the batch's response tokens,
  as the PPO reference implementations (verl, OpenRLHF) do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll_device.errors import ConfigError
from strategies.training.named import Registry

ADVANTAGES = Registry(
    "advantage estimator",
    "algorithm.advantage",
    {
        "grpo": "strategies.training.advantages:grpo",
        "rloo": "strategies.training.advantages:rloo",
        "reinforce_pp": "strategies.training.advantages:reinforce_pp",
        "reinforce_pp_baseline": "strategies.training.advantages:reinforce_pp_baseline",
        "gae": "strategies.training.advantages:gae",
    },
)
GROUP_ESTIMATORS = {"grpo", "rloo", "reinforce_pp_baseline"}  # compare the samples of one prompt
STD_EPS = 1e-6


@dataclass(frozen=True)
class AdvantageSpec:
    """What an estimator is told (from `algorithm`)."""

    name: str = "grpo"
    norm_std: bool = True
    std_unbiased: bool = True
    kl_coef: float = 0.0
    kl_in_reward: bool = False
    gamma: float = 1.0  # gae's discount
    lam: float = 1.0  # gae's lambda


@dataclass
class AdvantageInputs:
    """A step's scores (N,), its rows' response tokens (N, T) and, when there, the logprobs and
    the critic's values (N, T) of the response tokens, and rewards already placed on tokens
    (`placed`, (N, T): a multi-turn trajectory's turn rewards, each on its turn's last model
    token; the token-level estimators take them instead of each row's score on its last token)."""

    scores: torch.Tensor
    group_size: int
    response_mask: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    placed: torch.Tensor | None = None


def advantages(inputs: AdvantageInputs, settings: AdvantageSpec) -> torch.Tensor:
    """The advantages of estimator `settings.name`."""
    scores = inputs.scores
    if inputs.group_size < 1 or scores.dim() != 1 or scores.numel() % inputs.group_size:
        raise ConfigError(
            f"advantages: {tuple(scores.shape)} rewards do not split into groups of {inputs.group_size}: "
            "pass a 1-D tensor whose length is a multiple of the samples per prompt"
        )
    return ADVANTAGES.resolve(settings.name)(inputs, settings).float()


def token_kl(inputs: AdvantageInputs, settings: AdvantageSpec) -> torch.Tensor:
    """kl_coef * (old - ref) on the response tokens (N, T); zeros without `kl_in_reward`."""
    mask = inputs.response_mask.float()
    if not settings.kl_in_reward:
        return torch.zeros_like(mask)
    if inputs.old_logprobs is None or inputs.ref_logprobs is None:
        raise ConfigError("algorithm.kl_in_reward=true needs the trainer's and the reference's logprobs")
    return settings.kl_coef * (inputs.old_logprobs - inputs.ref_logprobs).float() * mask


def sequence_scores(inputs: AdvantageInputs, settings: AdvantageSpec) -> torch.Tensor:
    """Each row's score less its KL penalty (when in the reward), as (groups, G)."""
    scores = inputs.scores.float()
    if settings.kl_in_reward:
        scores = scores - token_kl(inputs, settings).sum(dim=1)
    return scores.view(-1, inputs.group_size)


def token_rewards(inputs: AdvantageInputs, settings: AdvantageSpec) -> torch.Tensor:
    """Per-token rewards (N, T): the score on each row's last response token (or the rewards
    `placed` on tokens), less the KL."""
    rewards = -token_kl(inputs, settings)
    if inputs.placed is not None:
        return rewards + inputs.placed.float()
    mask = inputs.response_mask.float()
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).max(dim=1).values
    rows = torch.nonzero(last >= 0).squeeze(1)  # a row without response tokens has no reward to place
    rewards[rows, last[rows]] += inputs.scores.float()[rows]
    return rewards


def whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) over the masked entries (unbiased var), zero elsewhere."""
    mask = mask.float()
    count = mask.sum()
    mean = (values * mask).sum() / count.clamp(min=1)
    var = (((values - mean) ** 2) * mask).sum() / (count - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + 1e-8) * mask


def grpo(inputs: AdvantageInputs, settings: AdvantageSpec) -> torch.Tensor:
    groups = sequence_scores(inputs, settings)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if not settings.norm_std:
        return centred.view(-1)
    if inputs.group_size == 1:
        return torch.zeros_like(centred).view(-1)
    std = groups.std(dim=1, keepdim=True, unbiased=settings.std_unbiased)
    return (centred / (std + STD_EPS)).view(-1)


def rloo(inputs: AdvantageInputs, settings: AdvantageSpec) -> torch.Tensor:
    size = inputs.group_size
    if size < 2:
        raise ConfigError("advantage rloo needs algorithm.samples_per_prompt >= 2 (a leave-one-out baseline)")
    groups = sequence_scores(inputs, settings)
    others = (groups.sum(dim=1, keepdim=True) - groups) / (size - 1)
    return (groups - others).view(-1)


def reinforce_pp(inputs: AdvantageInputs, settings: AdvantageSpec) -> torch.Tensor:
    rewards = token_rewards(inputs, settings)
    returns = rewards.flip(1).cumsum(1).flip(1)
    return whiten(returns, inputs.response_mask)


def reinforce_pp_baseline(inputs: AdvantageInputs, settings: AdvantageSpec) -> torch.Tensor:
    groups = sequence_scores(inputs, settings)
    centred = (groups - groups.mean(dim=1, keepdim=True)).view(-1, 1)
    mask = inputs.response_mask.float()
    return whiten(centred * mask, mask)


def gae_advantages(inputs: AdvantageInputs, settings: AdvantageSpec) -> torch.Tensor:
    """GAE's (N, T) advantages before whitening, zero off the response tokens: one reverse pass
    over the positions, which carries V_{t+1} and A_{t+1} across positions that are no response
    token (so a row that ends early starts from 0 after its last token)."""
    if inputs.values is None:
        raise ConfigError("algorithm.advantage=gae needs the critic's values: configure roles.critic")
    mask = inputs.response_mask.float()
    values, rewards = inputs.values.float() * mask, token_rewards(inputs, settings)
    following = torch.zeros(mask.shape[0])  # A_{t+1}
    next_value = torch.zeros(mask.shape[0])  # V_{t+1}
    out = torch.zeros_like(mask)
    for t in reversed(range(mask.shape[1])):
        delta = rewards[:, t] + settings.gamma * next_value - values[:, t]
        here = delta + settings.gamma * settings.lam * following
        out[:, t] = here * mask[:, t]
        following = torch.where(mask[:, t] > 0, here, following)
        next_value = torch.where(mask[:, t] > 0, values[:, t], next_value)
    return out


def gae(inputs: AdvantageInputs, settings: AdvantageSpec) -> torch.Tensor:
    return whiten(gae_advantages(inputs, settings), inputs.response_mask)


def gae_returns(inputs: AdvantageInputs, settings: AdvantageSpec) -> torch.Tensor:
    """The critic's targets (N, T): GAE's advantages (not whitened) plus the values."""
    mask = inputs.response_mask.float()
    return (gae_advantages(inputs, settings) + inputs.values.float()) * mask


def informative_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups' rewards are not all equal (N / G,) bool: DAPO's dynamic sampling keeps those
    (a group of equal rewards has zero advantage under every group estimator)."""
    groups = scores.view(-1, group_size)
    return (groups.max(dim=1).values - groups.min(dim=1).values) > 0


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer: int, factor: float) -> torch.Tensor:
    """DAPO's soft overlong punishment: 0 up to max_tokens - buffer tokens, then falling linearly
    to -factor at max_tokens (arXiv 2503.14476, eq. 13); zeros when `buffer` is 0."""
    if buffer == 0:
        return torch.zeros(lengths.shape)
    over = (lengths.float() - (max_tokens - buffer)).clamp(min=0)
    return -factor * over / buffer
