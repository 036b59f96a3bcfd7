"""Megatron-core trainer checks on the tiny Qwen3 and Qwen3-MoE, run in spawned gloo ranks
(local_ranks.py): transformers' logprobs on the same weights, the export under transformers'
names, steps with routing metrics, and the expert-parallel layout against a plain step."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from strategies.training.checkpoint_export import hf_state_dict
from strategies.training.losses import nll_loss
from tests.strategies.routes_checks import other_routes, routed_logprobs
from tests.strategies.training.data import concat, make_batch
from tests.strategies.training.fsdp_checks import max_diff, plain_logprobs, reference_step
from tests.strategies.training.megatron_checks import hf_names, new_trainer


def against_transformers(trainer, model_path: str, batch) -> dict:
    """The trainer's logprobs and export against transformers holding the checkpoint, and (after
    the caller's steps) the export loaded into transformers against the trainer's logprobs."""
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    exported = dict(trainer.export_weights())
    return {
        "logprob_diff": (trainer.forward_logprobs(batch) - plain_logprobs(plain, batch)).abs().max().item(),
        "exported_names": sorted(exported),
        "hf_names": hf_names(plain),
        "export_diff": max_diff(exported, plain.state_dict()),
    }


def trained_export_diff(trainer, model_path: str, batch) -> float:
    """transformers holding the trainer's export against the trainer's own logprobs."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fresh = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    fresh.load_state_dict(dict(trainer.export_weights()), strict=True)
    return (plain_logprobs(fresh, batch) - trainer.forward_logprobs(batch)).abs().max().item()


def forced_routes(trainer, model_path: str, batch) -> dict:
    """The trainer's logprobs with routes forced on every token (routing replay) against
    transformers' with its routers forced the same way, and against the trainer's own routing."""
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    own = trainer.forward_logprobs(batch)
    routes = other_routes(batch, plain.config.num_hidden_layers, plain.config.num_experts)
    forced = trainer.forward_logprobs(replace(batch, routed_experts=routes))
    return {
        "vs_transformers": (forced - routed_logprobs(plain, batch, routes)).abs().max().item(),
        "vs_own": (forced - own).abs().max().item(),
    }


def qwen3_models(rank: int, dense_path: str, moe_path: str) -> dict:
    """One rank: the tiny Qwen3 (QK-norm) and Qwen3-MoE in Megatron against transformers; two MoE
    steps with the router's load-balancing loss report routing metrics and train."""
    batch = make_batch(seed=3, rows=4)
    dense = new_trainer(dense_path)
    out = {"dense": against_transformers(dense, dense_path, batch)}
    dense.shutdown()
    moe = new_trainer(moe_path, router_aux_loss_coef=0.01, routing_replay=True)
    out["moe"] = against_transformers(moe, moe_path, batch)
    out["moe"]["forced_routes"] = forced_routes(moe, moe_path, batch)
    out["moe"]["steps"] = [moe.train_step(batch, nll_loss()) for _ in range(2)]
    out["moe"]["trained_export_diff"] = trained_export_diff(moe, moe_path, batch)
    moe.shutdown()
    return out


def expert_parallel(rank: int, moe_path: str, checkpoint_dir: str, precision: str = "") -> dict:
    """expert_parallel=2 on 2 ranks (2 data-parallel ranks of the dense layers, each its own rows,
    4 of the 8 experts each, tokens exchanged by the all-to-all dispatcher): transformers'
    logprobs, a first step equal to a plain step on both ranks' rows, a second step, the export
    of every expert on every rank, and a checkpoint that a fresh trainer and `roll-device
    export`'s reader (one process, no group) both read back as the trained weights. `precision`:
    the trainer's mixed_precision where the platform's default is not fp32 (an accelerator's)."""
    seeds = [100, 101]
    batch = make_batch(seed=seeds[rank])
    layout = {"expert_parallel": 2, **({"mixed_precision": precision} if precision else {})}
    trainer = new_trainer(moe_path, **layout)
    out = against_transformers(trainer, moe_path, batch)
    out["local_experts"] = sum(
        1
        for n, _ in trainer.gpt.named_parameters()
        if n.startswith("decoder.layers.0.mlp.experts.") and n.endswith("linear_fc1.weight")
    )
    out["expert_group_size"] = dist.get_world_size(trainer.ep_group)
    first = trainer.train_step(batch, nll_loss())
    out["reference_grad_norm"], reference = reference_step(moe_path, concat([make_batch(s) for s in seeds]))
    out["grad_norm"] = first["grad_norm"]
    out["weight_diff_vs_reference"] = max_diff(dict(trainer.export_weights()), reference)
    out["steps"] = [first, trainer.train_step(batch, nll_loss())]
    out["trained_export_diff"] = trained_export_diff(trainer, moe_path, batch)
    trained = dict(trainer.export_weights())
    trainer.save_checkpoint(checkpoint_dir)
    restored = new_trainer(moe_path, **layout)
    restored.load_checkpoint(checkpoint_dir)
    out["reload_diff"] = max_diff(dict(restored.export_weights()), trained)
    out["checkpoint_export_diff"] = max_diff(hf_state_dict(checkpoint_dir, moe_path), trained)
    for each in (restored, trainer):
        each.shutdown()
    return out
