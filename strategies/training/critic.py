"""PPO's critic on FSDP2: the policy's architecture with a scalar value head, and the clipped value
loss it trains with.

The model is transformers' own `AutoModelForTokenClassification` with `num_labels=1` (verl's
critic is the same), its classifier dropout off (transformers' default of 0.1 would make the
values random in training), built and sharded as the FSDP trainer builds the policy
(strategies/training/fsdp.py). It is initialised from a causal LM's checkpoint (the policy's, or
`critic.model_path`): the backbone's weights load by name, and the head, which such a checkpoint
lacks, starts at zero, so the first values are 0 (a checkpoint of a critic brings its own head).

Values are aligned like logprobs (strategies/training/batches.py): token t's value V_t is the head's
output at position t - 1, the state from which token t is chosen; only response tokens have one.

The clipped value loss (PPO, Schulman et al. arXiv 1707.06347, as OpenAI baselines' ppo2 and
verl's `compute_value_loss` compute it): with the values before the update V_old, the returns R and
V_clip = V_old + clip(V - V_old, -value_clip, value_clip),
    L = 1/2 * token-mean over the response tokens of max((V - R)^2, (V_clip - R)^2).
"""

from __future__ import annotations

import warnings

import torch

from strategies.base import LossFn, TrainBatch
from strategies.training.fsdp import FsdpTrainStrategy
from strategies.training.fsdp_loading import empty_model, fill_shards
from strategies.training.logprobs import model_inputs
from strategies.training.losses import masked_mean

VALUE_HEAD_CLASS = "AutoModelForTokenClassification"
# The head's output (a biased linear layer on (B, T, H): a view of its flat matmul) makes FSDP2 warn
# on every forward that an in-place op on it would skip its pre-backward hook; `_values` only takes
# out-of-place views of it.
warnings.filterwarnings(
    "ignore", message=r"FSDP2-wrapped module \(FSDP\w+ForTokenClassification\) returned a view"
)


def value_loss(value_clip: float) -> LossFn:
    """PPO's clipped value loss (module docstring) as a trainer loss `(values, batch)`; the batch
    carries `values` (before the update) and `returns`."""

    def loss_fn(values: torch.Tensor, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        device, dtype = values.device, values.dtype
        mask = batch.response_mask.to(device, dtype)
        old, returns = batch.values.to(device, dtype), batch.returns.to(device, dtype)
        clipped = old + (values - old).clamp(-value_clip, value_clip)
        unclipped_error, clipped_error = (values - returns) ** 2, (clipped - returns) ** 2
        loss = 0.5 * masked_mean(torch.maximum(unclipped_error, clipped_error), mask)
        clip_share = masked_mean((clipped_error > unclipped_error).to(dtype), mask)
        return loss, {"value_clipfrac": clip_share.item()}

    return loss_fn


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the response tokens: 1 when the values predict the returns,
    0 when they predict no better than the returns' mean (verl's `vf_explained_var`)."""
    mask = mask.float()

    def variance(x: torch.Tensor) -> torch.Tensor:
        mean = masked_mean(x, mask)
        return masked_mean((x - mean) ** 2, mask)

    return (1 - variance(returns - values) / variance(returns).clamp(min=1e-8)).item()


class FsdpCriticStrategy(FsdpTrainStrategy):
    """The critic's FSDP2 trainer: values of the response tokens, and a step of the value loss."""

    update_name = "critic's value update"
    trains_adapters = False  # the critic trains every weight, beside a LoRA policy too
    # transformers' token-classification output of a mixture of experts carries no router logits or
    # load-balancing loss: the critic's routers learn from the value loss alone (as verl's critic)
    balances_routers = False

    def _empty_model(self, model_path: str) -> torch.nn.Module:
        return empty_model(
            model_path,
            self.settings.attn_implementation,
            self.device,
            VALUE_HEAD_CLASS,
            num_labels=1,
            classifier_dropout=0.0,
        )

    def _fill(self, model_path: str) -> None:
        """The backbone from the checkpoint; a head it lacks at zero (the head is every parameter
        outside the base model)."""
        backbone = f"{self.model.base_model_prefix}."
        head = next(name for name, _ in self.model.named_parameters() if not name.startswith(backbone))
        fill_shards(self.model, model_path, new_head=head.split(".")[0] + ".")

    def _values(self, micro: TrainBatch) -> torch.Tensor:
        """(B, T) values of `micro`'s response tokens (0 elsewhere), in fp32."""
        inputs, align = model_inputs(micro, self.device, self.settings.packing)
        per_position = self.model(**inputs, use_cache=False).logits.squeeze(-1).float()
        return align(per_position) * micro.response_mask.to(per_position.device, per_position.dtype)

    def forward_values(self, batch: TrainBatch) -> torch.Tensor:
        """Per-token values without gradients (B, T)."""
        return self._forward(batch, self._values)

    def train_values(self, batch: TrainBatch, value_clip: float) -> dict[str, float]:
        """One optimizer step of the clipped value loss towards `batch.returns`."""
        return self._train(batch, value_loss(value_clip), lambda micro: (self._values(micro), {}, None))
