"""The routing of the Megatron trainer's MoE layers, reported as the FSDP trainer reports it (the
metrics of routing.py): while `recording`, a forward hook on each layer's router keeps its logits,
recomputed from the router's input (one small matmul, no gradient; megatron's router returns only
the top-k choices), in transformers' token order. Per micro-batch they become transformers'
load-balancing loss (`load_balancing_loss_func`, padding excluded, minimum top-k) and the expert
load imbalance over the real tokens (routing.py's `Routing.imbalance`).

A rank sees the routers of its pipeline stage: with several stages the last stage's layers are
reported (the stage that computes the loss and its metrics).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from strategies.training.routing import Routing


class RouterTaps:
    """The router logits of the forwards run while `recording` (one tensor per layer, tokens in
    (row, position) order by experts)."""

    def __init__(self, model: torch.nn.Module, num_experts: int, top_k: int) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        self.routing, self.num_experts = Routing(top_k), num_experts
        self.logits: list[torch.Tensor] = []
        self.on = False
        for module in model.modules():
            if isinstance(module, TopKRouter):
                module.register_forward_hook(self._keep)

    def _keep(self, module: torch.nn.Module, args, output) -> None:
        if self.on:
            with torch.no_grad():  # the input is megatron's (sequence, row, hidden)
                logits = F.linear(args[0].float(), module.weight.float())
            self.logits.append(logits.transpose(0, 1).reshape(-1, self.num_experts))

    @contextmanager
    def recording(self) -> Iterator[RouterTaps]:
        self.on, self.logits = True, []
        try:
            yield self
        finally:
            self.on, self.logits = False, []

    def clear(self) -> None:
        """Forget what earlier passes left (a recomputation in the backward reruns the routers)."""
        self.logits = []

    def take(self, attention_mask: torch.Tensor) -> dict[str, float]:
        """The routing metrics of the forward since the last `clear` over its (rows, positions)
        `attention_mask`'s real tokens; empty when not recording."""
        logits, self.logits = self.logits, []
        if not logits:
            return {}
        from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

        mask = attention_mask.to(logits[0].device)
        aux_loss = load_balancing_loss_func(tuple(logits), self.num_experts, self.routing.top_k, mask)
        imbalance = [self.routing.imbalance(layer, mask) for layer in logits]
        return {"router_aux_loss": float(aux_loss), "expert_imbalance": sum(imbalance) / len(imbalance)}
