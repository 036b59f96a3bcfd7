"""The routing of the Megatron trainer's MoE layers, reported as the FSDP trainer reports it (the
metrics of routing.py): while `recording`, a forward hook on each layer's router keeps its logits,
recomputed from the router's input (one small matmul, no gradient; megatron's router returns only
the top-k choices), in transformers' token order. Per micro-batch they become transformers'
load-balancing loss (`load_balancing_loss_func`, padding excluded, minimum top-k) and the expert
load imbalance over the real tokens (routing.py's `Routing.imbalance`).

A rank sees the routers of its pipeline stage: with several stages the last stage's layers are
reported (the stage that computes the loss and its metrics).

`ReplayedRouters` is routing replay (`trainer.routing_replay`, strategies/routes.py) through
megatron-core's own replay hook: each `TopKRouter`'s `router_replay`, whose `get_replay_topk`
`topk_routing_with_score_function` asks for the top-k. Megatron's `RouterReplay` takes every token
from its target; this one takes the recorded experts of the tokens that have them and the router's
own top-k for the others (padding, a row's last token), and, as Megatron's does, gathers the
router's scores at the chosen experts (Qwen3's softmax after the top-k then renormalises over
them). Routes are set per micro-batch, before its forward: the recomputation in its backward
(no pipelining) replays the same ones.
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


class ReplayedRouters:
    """The model's routers, routed by the current micro-batch's recorded routes (`use`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        self.routes: torch.Tensor | None = None  # (tokens, layers, k) in megatron's token order
        for module in model.modules():
            if isinstance(module, TopKRouter):  # megatron's layer numbers count from 1, globally
                module.router_replay = LayerReplay(self, module.layer_number - 1)

    def use(self, routes: torch.Tensor | None) -> None:
        """Route by `routes` ((rows, T, layers, k), -1 where none; None: the routers' own) from now."""
        self.routes = None if routes is None else routes.transpose(0, 1).reshape(-1, *routes.shape[2:])


class LayerReplay:
    """One layer's `router_replay`: the top-k `topk_routing_with_score_function` routes by."""

    def __init__(self, routers: ReplayedRouters, layer: int) -> None:
        self.routers, self.layer = routers, layer

    def get_replay_topk(self, scores, topk, num_groups, group_topk, default_compute_topk):
        values, indices = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        if self.routers.routes is None:
            return values, indices
        recorded = self.routers.routes[:, self.layer].to(indices.device, indices.dtype)
        chosen = torch.where((recorded < 0).any(dim=-1, keepdim=True), indices, recorded)
        return scores.gather(1, chosen), chosen
