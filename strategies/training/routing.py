"""A mixture-of-experts model's routing, seen from the FSDP trainer: transformers' MoE causal LMs
(Qwen3-MoE, Qwen2-MoE, Mixtral) return each layer's router logits and the router's load-balancing
loss (Switch Transformer's, `load_balancing_loss_func`, padding excluded) when asked for
`output_router_logits`. `capture` asks for them for the passes it wraps and keeps what each
forward returned; from them come the step's routing metrics:

- `router_aux_loss`: the load-balancing loss (its minimum, perfectly balanced routing, is top-k);
- `expert_imbalance`: the busiest expert's load over the mean load, from the router's top-k
  choices over the real tokens, averaged over the layers (1 is perfectly balanced; all tokens on
  k of E experts gives E / k).

With `trainer.router_aux_loss_coef` > 0 the loss adds that multiple of the load-balancing loss
(`check_routing`: only a model with experts has a router to balance, or routes to replay).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from roll_device.errors import ConfigError
from roll_device.models.hf_dir import num_experts
from strategies.training.settings import TrainSettings

METRICS = ("router_aux_loss", "expert_imbalance")  # a train step's routing metrics, in its metrics


class Routing:
    """What the forwards inside `capture` returned: the load-balancing loss (with its gradient)
    and the router logits of each layer, per forward."""

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        self.outputs: list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = []

    def hook(self, module: torch.nn.Module, args, kwargs, output) -> None:
        self.outputs.append((output.aux_loss, output.router_logits))

    def last(self, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        """The last forward's load-balancing loss and its metrics (`attention_mask`: the rows'
        mask, None for a packed row, whose tokens are all real)."""
        aux_loss, router_logits = self.outputs.pop()
        imbalance = [self.imbalance(logits, attention_mask) for logits in router_logits]
        metrics = {
            "router_aux_loss": float(aux_loss.detach()),
            "expert_imbalance": sum(imbalance) / len(imbalance),
        }
        return aux_loss, metrics

    def imbalance(self, logits: torch.Tensor, attention_mask: torch.Tensor | None) -> float:
        """Max over mean expert load of one layer's (tokens, experts) router logits."""
        logits = logits.detach()
        if attention_mask is not None:
            logits = logits[attention_mask.reshape(-1).bool().to(logits.device)]
        chosen = logits.topk(self.top_k, dim=-1).indices.reshape(-1)
        load = torch.bincount(chosen, minlength=logits.shape[-1]).float()
        return float(load.max() / load.mean())


def check_routing(settings: TrainSettings, model_path: str) -> None:
    """A ConfigError when the model at `model_path` has no experts (so no router to balance and no
    routes to replay) but `settings` ask for the router's loss or routing replay."""
    asked = []
    if settings.router_aux_loss_coef > 0:
        asked.append(("router_aux_loss_coef", settings.router_aux_loss_coef, "a router to balance", 0))
    if settings.routing_replay:
        asked.append(("routing_replay", "true", "routes to replay", "false"))
    if not asked:
        return
    from transformers import AutoConfig

    if num_experts(AutoConfig.from_pretrained(model_path)):
        return
    key, value, missing, off = asked[0]
    raise ConfigError(
        f"trainer.{key}={value}: model.path={model_path} is a dense model, without experts or {missing}: "
        f"set trainer.{key}={off}"
    )


@contextmanager
def capture(model: torch.nn.Module) -> Iterator[Routing]:
    """Within: `model`'s forwards return router logits and the load-balancing loss, kept on the
    yielded Routing."""
    config = model.config
    routing = Routing(config.num_experts_per_tok)
    before = config.output_router_logits
    config.output_router_logits = True
    handle = model.register_forward_hook(routing.hook, with_kwargs=True)
    try:
        yield routing
    finally:
        handle.remove()
        config.output_router_logits = before
