"""Routing replay on the tiny Qwen3-MoE, in one spawned rank (the FSDP trainer needs a process
group): the HF engine's recorded routes against a plain transformers forward, and the FSDP
trainer's logprobs with replay against transformers routed by a router forced the same way; the
same engine and trainer on multi-turn trajectories (tests/pipeline/agentic_routes_checks.py)."""

from __future__ import annotations

import torch

import roll_device as rd
from roll_device.pipeline.batching import build_batch
from strategies.base import SamplingConfig
from strategies.inference.hf import HfStrategy
from strategies.training.fsdp import token_logprobs
from strategies.training.losses import nll_loss
from tests.configs import rollout_settings
from tests.pipeline.agentic_routes_checks import agentic_replay_checks, recorded_rollout
from tests.strategies.training.fsdp_checks import new_trainer

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12]]


def recorded_rollouts(model_path: str) -> tuple[list, tuple[list, list]]:
    """From the HF engine asked to record routes: two samples per prompt, and 2-turn trajectories
    with the requests they made (`recorded_rollout`)."""
    engine = HfStrategy(rd.get_platform("cpu"))
    engine.record_routes()
    engine.initialize(model_path, rollout_settings("hf", max_batch_size=4, dtype="float32"))
    completions = engine.generate(PROMPTS, SamplingConfig(n=2, max_tokens=6, temperature=1.0, seed=7))
    multi_turn = recorded_rollout(engine, model_path)
    engine.shutdown()
    return completions, multi_turn


def transformers_routes(model, tokens: list[int]) -> torch.Tensor:
    """(tokens, layers, k) top-k of the router logits transformers returns for `tokens` alone."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([tokens]), output_router_logits=True)
    k = model.config.num_experts_per_tok
    return torch.stack([logits.topk(k, dim=-1).indices for logits in out.router_logits], dim=1)


def forced(model, routes: torch.Tensor):
    """`model`'s routers replaced by ones that take the top-k of `routes` ((tokens, layers, k),
    row by row) and weigh them by their normalised softmax: what replay must compute."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    handles = []
    for layer, router in enumerate(m for m in model.modules() if isinstance(m, Qwen3MoeTopKRouter)):

        def hook(module, args, output, layer=layer):
            chosen = routes[:, layer].long()
            probs = torch.softmax(output[0].float(), dim=-1).gather(-1, chosen)
            return output[0], probs / probs.sum(dim=-1, keepdim=True), chosen

        handles.append(router.register_forward_hook(hook))
    return handles


def other_routes(batch, layers: int, experts: int) -> torch.Tensor:
    """(B, T, layers, 2) routes for every token of `batch`, other than its own most of the time."""
    g = torch.Generator().manual_seed(11)
    first = torch.randint(0, experts, (*batch.input_ids.shape, layers), generator=g)
    return torch.stack([first, (first + 3) % experts], dim=-1).to(torch.int16)


def routed_logprobs(model, batch, routes: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' logprobs of `batch`, its routers forced to `routes` ((B, T, layers, k)) if given."""
    handles = [] if routes is None else forced(model, routes.reshape(-1, *routes.shape[2:]))
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    for handle in handles:
        handle.remove()
    return token_logprobs(logits, batch.input_ids, batch.attention_mask)


def replay_checks(rank: int, model_path: str) -> dict:
    from transformers import AutoModelForCausalLM

    completions, multi_turn = recorded_rollouts(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    fed = [PROMPTS[c.prompt_index] + c.token_ids[:-1] for c in completions]
    out = {
        "recorded": [c.routed_experts.tolist() for c in completions],
        "transformers": [transformers_routes(model, tokens).tolist() for tokens in fed],
    }
    batch, _ = build_batch(PROMPTS, completions, pad_id=0, advantages=torch.ones(len(completions)))
    other = other_routes(batch, model.config.num_hidden_layers, model.config.num_experts)
    trainer = new_trainer(model_path, routing_replay=True)
    replayed, free = trainer.forward_logprobs(batch), routed_logprobs(model, batch)
    out["agentic"] = agentic_replay_checks(trainer, *multi_turn)
    batch.routed_experts = other
    forced_logprobs = trainer.forward_logprobs(batch)
    mask = batch.response_mask.bool()
    out["replayed_vs_free"] = (replayed - free)[mask].abs().max().item()
    out["forced_vs_transformers"] = (
        (forced_logprobs - routed_logprobs(model, batch, other))[mask].abs().max().item()
    )
    out["forced_vs_free"] = (forced_logprobs - free)[mask].abs().max().item()
    out["step"] = trainer.train_step(batch, nll_loss())
    trainer.shutdown()
    out["other_layouts"] = [replayed_grad_norm(model_path, batch, **layout) for layout in LAYOUTS]
    return out


# micro-batch layouts whose replay must route as the plain one does: the recomputation in the
# backward (gradient checkpointing), and packed rows
LAYOUTS = ({"recompute": True}, {"packing": True, "max_tokens_per_micro_batch": 64})


def replayed_grad_norm(model_path: str, batch, **layout) -> float:
    """The gradient norm of one replayed step on `batch` with a fresh trainer of `layout`."""
    trainer = new_trainer(model_path, routing_replay=True, **layout)
    grad_norm = trainer.train_step(batch, nll_loss())["grad_norm"]
    trainer.shutdown()
    return grad_norm
