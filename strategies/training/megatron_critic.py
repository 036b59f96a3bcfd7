"""PPO's critic on megatron-core: the policy's GPTModel with a scalar value head in place of its
output layer, trained by the clipped value loss (strategies/training/critic.py) in every layout the
Megatron trainer runs (tensor x pipeline x data, expert parallel for a mixture of experts).

The head is what transformers' `AutoModelForTokenClassification` with `num_labels=1` puts on the
backbone (the FSDP critic's model): a biased linear layer from the hidden size to 1, named `score`
in a checkpoint. It sits on the last pipeline stage, whole on every tensor-parallel rank (one output
cannot be split; its input, the final norm's output, is whole there too), so its gradients agree
over those ranks as the norms' do. Its weights are loaded from the checkpoint when it has them (a
critic's), else they start at zero, so the first values are 0. The embedding is never tied to it.

Values are aligned as the FSDP critic aligns them: token t's value is the head's output at
position t - 1, on response tokens only. A mixture of experts' critic adds no load-balancing loss
(as the FSDP critic, whose transformers output carries none): its routers learn from the value loss.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import torch

from strategies.base import TrainBatch
from strategies.training import megatron_model
from strategies.training.batches import align_to_tokens
from strategies.training.critic import value_loss
from strategies.training.megatron import MegatronTrainStrategy
from strategies.training.megatron_weights import REPLICATED, Param
from strategies.training.settings import MegatronSettings

HEAD = "output_layer."  # the Megatron name of the output layer the value head replaces
SCORE = ("score.weight", "score.bias")  # the head's names in a transformers token-classification checkpoint


class ValueHead(torch.nn.Linear):
    """hidden -> 1, called as GPTModel calls its output layer (`weight=` is the tied embedding's,
    never given here; the output gathered already) and answering as it does: (output, bias)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__(hidden_size, 1)
        with torch.no_grad():
            self.weight.zero_()
            self.bias.zero_()

    def forward(self, hidden: torch.Tensor, weight=None, runtime_gather_output=None) -> tuple:
        return super().forward(hidden), None


class HeadOrZeros(Mapping[str, torch.Tensor]):
    """A checkpoint's tensors, with a zero head where it has none (a causal LM's checkpoint)."""

    def __init__(self, weights: Mapping[str, torch.Tensor], hidden_size: int) -> None:
        self.weights = weights
        self.zeros = {SCORE[0]: torch.zeros(1, hidden_size), SCORE[1]: torch.zeros(1)}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.zeros and name not in self.weights:
            return self.zeros[name]
        return self.weights[name]

    def __iter__(self) -> Iterator[str]:
        return iter({**self.zeros, **dict.fromkeys(self.weights)})

    def __len__(self) -> int:
        return sum(1 for _ in self)


class MegatronCriticStrategy(MegatronTrainStrategy):
    """The critic's Megatron trainer: values of the response tokens, and a step of the value loss."""

    update_name = "critic's value update"
    balances_routers = False

    def initialize(self, model_path: str, settings: MegatronSettings) -> None:
        super().initialize(model_path, settings.model_copy(update={"router_aux_loss_coef": 0.0}))

    def _describe(self, hf_config) -> megatron_model.ModelPlan:
        plan = super()._describe(hf_config)
        return replace(plan, shape=replace(plan.shape, tied_embeddings=False))

    def _new_model(self, config) -> Any:
        model = super()._new_model(config)
        if self.stages.is_last:
            model.output_layer = ValueHead(self.plan.hidden_size)
        return model

    def _join_groups(self) -> None:
        """The policy's weights table with the value head in place of the output layer."""
        super()._join_groups()
        table = [p for p in self.table if not p.megatron.startswith(HEAD)]
        if self.stages.is_last:
            table += [Param(HEAD + name.split(".")[1], (name,), REPLICATED) for name in SCORE]
        self.table = table

    def _build(self, hf_weights: Mapping[str, torch.Tensor]) -> None:
        super()._build(HeadOrZeros(hf_weights, self.plan.hidden_size))

    def _per_token(self, output: torch.Tensor, ids: torch.Tensor, micro: TrainBatch) -> torch.Tensor:
        """(B, T) values of `micro`'s response tokens (0 elsewhere), in fp32."""
        values = align_to_tokens(output.squeeze(-1).float(), micro.attention_mask.to(self.device))
        return values * micro.response_mask.to(self.device, values.dtype)

    def forward_values(self, batch: TrainBatch) -> torch.Tensor:
        """Per-token values without gradients (B, T), on every rank."""
        return self.forward_logprobs(batch)

    def train_values(self, batch: TrainBatch, value_clip: float) -> dict[str, float]:
        """One optimizer step of the clipped value loss towards `batch.returns`."""
        return self.train_step(batch, value_loss(value_clip))
