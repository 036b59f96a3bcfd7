"""Loss functions for the RL pipeline: the policy losses by name (`algorithm.policy_loss`), each
with an optional KL penalty to the reference policy and an aggregation over tokens and rows
(`algorithm.loss_agg`), and a supervised (NLL) loss.

A loss function has the trainer signature `loss_fn(logprobs, batch) -> (loss, metrics)`: `logprobs`
is (B, T) with grad, aligned with `batch.input_ids`; only response tokens (`batch.response_mask`)
count. A loss that `needs_entropy` (an entropy bonus, `entropy_coef` > 0: PPO's c2 S[pi], arXiv
1707.06347 eq. 9) is called `loss_fn(logprobs, batch, entropy)` with the (B, T) per-token entropy. A policy loss also carries `units(response_mask)`: how much of the step a micro-batch is
(its response tokens for token-mean, its scored rows for the seq-mean modes), so that the trainer
weighs micro-batches and data-parallel ranks into the aggregation over the global batch.

A registered policy loss is `token_loss(logprobs, old, advantages, mask, settings) -> (per-token
loss (B, T), per-token metrics)`; `advantages` broadcasts to (B, T). The losses:
- `ppo_clip`: -min(r A, clip(r, 1 - clip_ratio, 1 + clip_ratio_high) A), r = exp(logp - old)
  (clip-higher: DAPO's clip_ratio_high > clip_ratio); with `clip_ratio_c` the dual clip bounds the
  loss of a negative advantage by -clip_ratio_c * A (arXiv 1912.09729).
- `gspo` (arXiv 2507.18071): the same clipped surrogate on the sequence's length-normalised ratio
  s = exp(mean over the row's tokens of (logp - old)), its gradient flowing through each token.
- `cispo` (MiniMax-M1, arXiv 2506.13585): -sg(clip(r, 1 - clip_ratio, 1 + clip_ratio_high)) A logp.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll_device.errors import ConfigError
from strategies.base import LossFn, TrainBatch
from strategies.training.named import Registry

POLICY_LOSSES = Registry(
    "policy loss",
    "algorithm.policy_loss",
    {
        "ppo_clip": "strategies.training.losses:ppo_clip",
        "gspo": "strategies.training.losses:gspo",
        "cispo": "strategies.training.losses:cispo",
    },
)
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class LossSpec:
    """What a policy loss is told (from `algorithm`); `name` a registered name or module:function."""

    name: str = "ppo_clip"
    clip_ratio: float = 0.2
    clip_ratio_high: float | None = None  # None: clip_ratio
    clip_ratio_c: float | None = None  # ppo_clip's dual clip (> 1); None: off
    kl_coef: float = 0.0
    loss_agg: str = "token-mean"
    importance_ratio_cap: float = 2.0
    max_response_tokens: int | None = None  # seq-mean-token-sum-norm's constant (None: the batch's width)
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0  # the entropy bonus: the loss less entropy_coef * the aggregated entropy

    @property
    def high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 when the mask is empty."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


@dataclass(frozen=True)
class LossAggregation:
    """A per-token loss (B, T) to one number (verl's loss_agg_mode): the mean over response tokens
    (`token-mean`), or the mean over rows with a response token of the row's token mean, token
    sum, or token sum over the constant `norm` (Dr. GRPO's `seq-mean-token-sum-norm`)."""

    mode: str
    norm: int | None = None

    def reduce(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        mask = mask.to(values.dtype)
        if self.mode == "token-mean":
            return masked_mean(values, mask)
        sums, tokens = (values * mask).sum(dim=1), mask.sum(dim=1)
        per_row = {
            "seq-mean-token-mean": lambda: sums / tokens.clamp(min=1.0),
            "seq-mean-token-sum": lambda: sums,
            "seq-mean-token-sum-norm": lambda: sums / (self.norm or mask.shape[1]),
        }[self.mode]()
        rows = (tokens > 0).to(values.dtype)
        return (per_row * rows).sum() / rows.sum().clamp(min=1.0)

    def units(self, mask: torch.Tensor) -> float:
        """This batch's share of the global aggregation: response tokens, or rows that have one."""
        return float(mask.sum()) if self.mode == "token-mean" else float((mask.sum(dim=1) > 0).sum())


def token_units(mask: torch.Tensor) -> float:
    """Response tokens: the share of a loss without its own `units` (token-mean)."""
    return float(mask.sum())


def policy_loss(settings: LossSpec) -> LossFn:
    """The policy loss `settings.name`, aggregated by `settings.loss_agg`, with an estimate of
    KL(policy || reference) (`kl_estimator`, `kl_estimate`) added with weight `kl_coef` (> 0).
    Without `old_logprobs` the step is on-policy (ratio 1 with the plain policy gradient).

    Samples generated by older weights than the trainer's (`rollout_logprobs` set: an overlapped
    pipeline) weight each token's loss by the truncated importance ratio
    min(exp(old_logprobs - rollout_logprobs), importance_ratio_cap), without gradient (verl's and
    AReaL's decoupled correction); without `rollout_logprobs` the weights are 1.
    """
    check_loss_spec(settings)
    token_loss = POLICY_LOSSES.resolve(settings.name)
    aggregation = LossAggregation(settings.loss_agg, settings.max_response_tokens)

    def loss_fn(
        logprobs: torch.Tensor, batch: TrainBatch, entropy: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        _check_policy_batch(batch, settings)
        device, dtype = logprobs.device, logprobs.dtype
        mask = batch.response_mask.to(device, dtype)
        old = batch.old_logprobs.to(device, dtype) if batch.old_logprobs is not None else logprobs.detach()
        advantages = batch.advantages.to(device, dtype)
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        per_token, token_metrics = token_loss(logprobs, old, advantages, mask, settings)
        weights, importance = importance_weights(batch, old, settings.importance_ratio_cap, mask)
        loss = aggregation.reduce(per_token if weights is None else weights * per_token, mask)
        metrics = {
            "policy_loss": loss.item(),
            **{
                key: masked_mean(value.detach().to(dtype), mask).item()
                for key, value in token_metrics.items()
            },
            **importance,
        }
        if settings.entropy_coef > 0:
            loss = loss - settings.entropy_coef * aggregation.reduce(entropy, mask)
        if settings.kl_coef > 0:
            kl = aggregation.reduce(kl_estimate(logprobs, batch.ref_logprobs, settings.kl_estimator), mask)
            return loss + settings.kl_coef * kl, {**metrics, "kl": kl.item()}
        return loss, metrics

    loss_fn.units = aggregation.units
    loss_fn.needs_entropy = settings.entropy_coef > 0  # the trainer passes the entropy, with gradient
    return loss_fn


def grpo_policy_loss(
    clip_ratio: float = 0.2,
    kl_coef: float = 0.0,
    clip_ratio_high: float | None = None,
    importance_ratio_cap: float = 2.0,
) -> LossFn:
    """GRPO's loss: `ppo_clip`, token-mean (the benchmarks' and tests' shorthand)."""
    return policy_loss(
        LossSpec("ppo_clip", clip_ratio, clip_ratio_high, None, kl_coef, "token-mean", importance_ratio_cap)
    )


def check_loss_spec(settings: LossSpec) -> None:
    """Refuses settings outside the loss's domain, naming the setting."""
    if not 0 < settings.clip_ratio < 1 or settings.high <= 0:
        raise ConfigError(
            f"{settings.name}: clip_ratio must be in (0, 1) and clip_ratio_high > 0, got "
            f"{settings.clip_ratio} and {settings.clip_ratio_high} (0.2 is the usual value)"
        )
    if settings.clip_ratio_c is not None and settings.clip_ratio_c <= 1:
        raise ConfigError(
            f"{settings.name}: clip_ratio_c must be > 1 (3.0 is the usual value), got {settings.clip_ratio_c}"
        )
    if settings.kl_coef < 0 or settings.entropy_coef < 0:
        raise ConfigError(
            f"{settings.name}: kl_coef and entropy_coef must be >= 0, got {settings.kl_coef} and "
            f"{settings.entropy_coef}"
        )
    if settings.importance_ratio_cap < 1:
        raise ConfigError(
            f"{settings.name}: importance_ratio_cap must be >= 1, got {settings.importance_ratio_cap}"
        )
    if settings.kl_estimator not in KL_ESTIMATORS:
        raise ConfigError(
            f"algorithm.kl_estimator={settings.kl_estimator!r}: choose one of {', '.join(KL_ESTIMATORS)}"
        )
    if settings.loss_agg not in LOSS_AGGREGATIONS:
        raise ConfigError(
            f"algorithm.loss_agg={settings.loss_agg!r}: choose one of {', '.join(LOSS_AGGREGATIONS)}"
        )


def _check_policy_batch(batch: TrainBatch, settings: LossSpec) -> None:
    """Refuses a batch without a field the loss needs, naming the field."""
    if batch.advantages is None:
        raise ConfigError(f"{settings.name} needs TrainBatch.advantages (one value per row or per token)")
    if settings.kl_coef > 0 and batch.ref_logprobs is None:
        raise ConfigError(
            f"{settings.name} with kl_coef={settings.kl_coef} needs TrainBatch.ref_logprobs "
            "(reference logprobs), or set kl_coef=0"
        )


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token surrogate -min(ratio * A, clip(ratio, 1 - low, 1 + high) * A) for the
    (B, T) `ratio` and `advantages` broadcast to it, and where the clipped term was the smaller."""
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - low, 1 + high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def ppo_clip(logprobs, old, advantages, mask, settings: LossSpec):
    ratio = torch.exp(logprobs - old)
    surrogate, clipped = clipped_surrogate(ratio, advantages, settings.clip_ratio, settings.high)
    if settings.clip_ratio_c is not None:  # dual clip: a negative advantage's loss stays <= -c * A
        bounded = torch.minimum(surrogate, -settings.clip_ratio_c * advantages)
        surrogate = torch.where(advantages < 0, bounded, surrogate)
    return surrogate, {"clip_fraction": clipped, "ratio_mean": ratio}


def gspo(logprobs, old, advantages, mask, settings: LossSpec):
    sequence = ((logprobs - old) * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(
        min=1.0
    )
    ratio = torch.exp(logprobs - logprobs.detach() + sequence.detach())  # value s, gradient s * grad logp
    surrogate, clipped = clipped_surrogate(ratio, advantages, settings.clip_ratio, settings.high)
    return surrogate, {"clip_fraction": clipped, "ratio_mean": ratio}


def cispo(logprobs, old, advantages, mask, settings: LossSpec):
    ratio = torch.exp(logprobs - old)
    weight = torch.clamp(ratio, 1 - settings.clip_ratio, 1 + settings.high).detach()
    return -weight * advantages * logprobs, {"clip_fraction": weight != ratio.detach(), "ratio_mean": ratio}


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """An estimate of KL(policy || reference) per token (Schulman's k1, k2, k3): with d = ref - logp,
    k1 = -d, k2 = d^2 / 2, k3 = exp(d) - d - 1; `low_var_kl` is k3 with d clamped to [-20, 20] and
    the estimate to [-10, 10] (verl's)."""
    delta = ref_logprobs.to(logprobs.device, logprobs.dtype) - logprobs
    if estimator == "k1":
        return -delta
    if estimator == "k2":
        return 0.5 * delta**2
    if estimator == "low_var_kl":
        delta = delta.clamp(-20, 20)
        return (torch.exp(delta) - delta - 1).clamp(-10, 10)
    return torch.exp(delta) - delta - 1


def importance_weights(
    batch: TrainBatch, old: torch.Tensor, cap: float, mask: torch.Tensor
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The truncated importance weights of a stale batch (None without `rollout_logprobs`: all 1),
    and their metrics: the untruncated ratio's mean and the share of tokens truncated."""
    if batch.rollout_logprobs is None:
        return None, {"importance_ratio_mean": 1.0, "importance_clipped_share": 0.0}
    ratio = torch.exp(old.detach() - batch.rollout_logprobs.to(old.device, old.dtype))
    return ratio.clamp(max=cap), {
        "importance_ratio_mean": masked_mean(ratio, mask).item(),
        "importance_clipped_share": masked_mean((ratio > cap).to(old.dtype), mask).item(),
    }


def nll_loss() -> LossFn:
    """Supervised loss: the negative log-likelihood of the response tokens, token-mean."""

    def loss_fn(logprobs: torch.Tensor, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return masked_mean(-logprobs, batch.response_mask.to(logprobs.device)), {}

    return loss_fn
