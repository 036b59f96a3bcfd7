"""Routed experts of a transformers mixture of experts, recorded and replayed (routing replay, "R3"
as verl, slime and Miles call it).

A token's route is, per decoder layer, the top-k experts its router chose: a (layers, k) integer
array, -1 for a layer without a router (a dense layer of a mixed model) or a token with no record.
The router of each MoE layer is the module class transformers records router logits from
(`_can_record_outputs["router_logits"]`), whose output is (logits, top-k weights, top-k indices).

- `RouteRecorder` (the HF engine): a forward hook on each router keeps the top-k indices of the
  forwards run while `recording`.
- `RouteReplay` (the FSDP trainer): while `replaying(routes)`, each router's top-k indices are
  the recorded ones for the tokens that have a record; the weights are still the trainer's own,
  its softmax over the router logits gathered at the recorded experts (renormalised over them
  where the router normalises its top-k), so the gradient reaches the router as in the R3 paper
  and Megatron's `RouterReplay`; tokens without a record route themselves.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch

NO_ROUTE = -1  # a layer or a token without a recorded choice
LAYER = re.compile(r"layers\.(\d+)\.")


def routers(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    """(decoder layer index, router) of every MoE layer of `model` (a causal LM, or one wrapped by
    PEFT), in layer order; a ValueError for a model without routers transformers records."""
    recorded = next(
        (
            m._can_record_outputs.get("router_logits")
            for m in model.modules()
            if hasattr(m, "_can_record_outputs")
        ),
        None,
    )
    if recorded is None:
        raise ValueError(
            f"{type(model).__name__} has no router whose logits transformers records (router_logits): "
            "its routes cannot be recorded or replayed"
        )
    found = [
        (int(LAYER.search(name).group(1)), module)
        for name, module in model.named_modules()
        if isinstance(module, recorded.target_class)
    ]
    return sorted(found, key=lambda pair: pair[0])


class RouteRecorder:
    """The top-k indices each router chose in the forwards of `model` run while `recording`:
    `steps` holds, per forward, a (tokens, layers, k) tensor on the CPU (tokens in the forward's
    (row, position) order; -1 for layers without a router)."""

    def __init__(self, model: torch.nn.Module, num_layers: int, top_k: int) -> None:
        self.shape, self.on = (num_layers, top_k), False
        self.steps: list[torch.Tensor] = []
        self._layers: dict[int, torch.Tensor] = {}
        for layer, router in routers(model):
            router.register_forward_hook(self._keeper(layer))
        model.register_forward_hook(self._end_forward)

    def _keeper(self, layer: int):
        def keep(module: torch.nn.Module, args, output) -> None:
            if self.on:
                self._layers[layer] = output[2].detach().to("cpu", torch.int16)

        return keep

    def _end_forward(self, module: torch.nn.Module, args, output) -> None:
        """After a whole forward: its layers' choices become one step."""
        layers, self._layers = self._layers, {}
        if not self.on or not layers:
            return
        tokens = next(iter(layers.values())).shape[0]
        step = torch.full((tokens, *self.shape), NO_ROUTE, dtype=torch.int16)
        for layer, chosen in layers.items():
            step[:, layer] = chosen
        self.steps.append(step)

    @contextmanager
    def recording(self) -> Iterator[RouteRecorder]:
        self.on, self.steps = True, []
        try:
            yield self
        finally:
            self.on = False

    def decoded_rows(self, prompt_lengths: list[int], response_lengths: list[int]) -> list[torch.Tensor]:
        """Each row's routes from a recorded generation whose first forward was the prefill of the
        prompts left-padded to the longest, then one forward per decode step with the rows first
        (padding rows after them): the prompt's tokens, then the response's but the last."""
        rows, width = len(prompt_lengths), max(prompt_lengths)
        prefill = self.steps[0].reshape(rows, width, *self.shape)
        decoded = [step[:rows] for step in self.steps[1:]]
        decoded = torch.stack(decoded, dim=1) if decoded else prefill[:, :0]
        return [
            torch.cat([prefill[row, width - prompt :], decoded[row, : max(response - 1, 0)]])
            for row, (prompt, response) in enumerate(zip(prompt_lengths, response_lengths))
        ]


class RouteReplay:
    """Routers that take their top-k from recorded routes while `replaying` (see the module
    docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.routes: torch.Tensor | None = None  # (tokens, layers, k) in the forward's token order
        for layer, router in routers(model):
            router.register_forward_hook(self._hook(layer))

    def _hook(self, layer: int):
        def replay(module: torch.nn.Module, args, output):
            if self.routes is None:
                return None
            return replayed(module, output, self.routes[:, layer].to(output[2].device))

        return replay

    @contextmanager
    def replaying(self, routes: torch.Tensor | None) -> Iterator[None]:
        """Within: the routers follow `routes` ((tokens, layers, k), the forward's token order;
        None: they route themselves)."""
        self.routes = routes
        try:
            yield
        finally:
            self.routes = None


def replayed(router: torch.nn.Module, output: tuple, recorded: torch.Tensor) -> tuple:
    """A router's (logits, weights, indices) with the indices of `recorded` ((tokens, k)) where a
    token has them, the weights gathered from the router's own probabilities at those indices."""
    logits, _weights, indices = output
    free = (recorded < 0).any(dim=-1, keepdim=True)
    chosen = torch.where(free, indices, recorded.to(indices.dtype))
    weights = logits.float().softmax(dim=-1).gather(-1, chosen)
    if getattr(router, "norm_topk_prob", True):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return logits, weights.to(logits.dtype), chosen


def batch_routes(routes: torch.Tensor, attention_mask: torch.Tensor, packed: bool) -> torch.Tensor:
    """A micro-batch's (B, T, layers, k) routes in the order its forward's routers see the tokens:
    (B x T, ...) row by row, or, `packed`, the real tokens only (the packed row)."""
    if packed:
        return routes[attention_mask.bool()]
    return routes.reshape(-1, *routes.shape[2:])
