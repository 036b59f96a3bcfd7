"""Megatron critic checks (strategies/training/megatron_critic.py), run in a fresh process or in
spawned gloo ranks: Megatron's parallel state is once per process."""

from __future__ import annotations

import torch
import torch.distributed as dist

import roll_device as rd
from strategies.registry import strategy_class
from tests.configs import trainer_settings
from tests.isolated import error_of
from tests.strategies.training.data import fixed_batch

CLIP = 0.2


def make_critic_checkpoint(model_path: str, directory: str) -> str:
    """The causal LM at `model_path` saved as transformers' critic model (token classification,
    one label) with a seeded random head: what a critic's own checkpoint holds."""
    from transformers import AutoModelForTokenClassification

    critic = AutoModelForTokenClassification.from_pretrained(model_path, num_labels=1)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in critic.score.parameters():
            param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    critic.save_pretrained(directory)
    return directory


def plain_values(model_path: str, batch) -> torch.Tensor:
    """transformers' critic model's values of `batch`: token t's from position t - 1, response tokens only."""
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(model_path, num_labels=1, dtype=torch.float32)
    with torch.no_grad():
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.squeeze(-1)
    values = torch.zeros_like(out)
    values[:, 1:] = out[:, :-1]
    return values * batch.response_mask


def new_critic(kind: str, model_path: str, **overrides):
    platform = rd.current_platform()
    critic = strategy_class("critic", kind, platform.kind)(platform)
    critic.initialize(model_path, trainer_settings(kind, lr=1e-3, **overrides))
    return critic


def value_steps(critic, batch, count: int) -> list[dict]:
    """`count` steps of the value loss, each from the critic's own values before it."""
    steps = []
    for _ in range(count):
        batch.values = critic.forward_values(batch)
        steps.append(critic.train_values(batch, CLIP))
    return steps


def against_fsdp(model_path: str, **overrides) -> dict:
    """The Megatron critic and the FSDP critic on the same checkpoint: values, then three steps."""
    fsdp, megatron = (
        new_critic("fsdp", model_path, **overrides),
        new_critic("megatron", model_path, **overrides),
    )
    fsdp_batch, megatron_batch = fixed_batch(), fixed_batch()
    out = {"first_values_diff": (fsdp.forward_values(fsdp_batch) - megatron.forward_values(megatron_batch))}
    out["fsdp_steps"], out["megatron_steps"] = (
        value_steps(fsdp, fsdp_batch, 3),
        value_steps(megatron, megatron_batch, 3),
    )
    out["values_diff_after"] = fsdp.forward_values(fsdp_batch) - megatron.forward_values(megatron_batch)
    for critic in (fsdp, megatron):
        critic.shutdown()
    return {k: v.abs().max().item() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def single_process(model_path: str, critic_path: str, moe_path: str, checkpoint_dir: str) -> dict:
    """One rank: against the FSDP critic (a critic's checkpoint, then a mixture of experts with the
    policy's routing settings), the head at zero from a causal LM, the checkpoint round trip, the
    export's names and a refused update."""
    out = {"dense": against_fsdp(critic_path), "moe": against_fsdp(moe_path, router_aux_loss_coef=0.001)}
    critic, batch = new_critic("megatron", model_path), fixed_batch()
    out["zero_head_values"] = critic.forward_values(batch).abs().max().item()
    out["exported_head"] = [name for name, _ in critic.export_weights() if name.startswith("score.")]
    value_steps(critic, batch, 2)
    critic.save_checkpoint(checkpoint_dir)
    out["after_save"] = value_steps(critic, batch, 1)[0]["loss"]
    restored = new_critic("megatron", model_path)
    restored.load_checkpoint(checkpoint_dir)
    out["after_load"] = value_steps(restored, batch, 1)[0]["loss"]
    batch.returns = torch.full_like(batch.returns, float("nan"))
    out["refused"] = error_of(lambda: restored.train_values(batch, CLIP))
    for trainer in (critic, restored):
        trainer.shutdown()
    return out


def two_ranks(rank: int, critic_path: str, tensor_parallel: int, pipeline_parallel: int) -> dict:
    """One model replica over 2 gloo ranks (TP=2 or PP=2, the same rows on both): values against
    transformers', and three value steps."""
    critic = new_critic(
        "megatron", critic_path, tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel
    )
    batch = fixed_batch()
    out = {
        "values_diff": (critic.forward_values(batch) - plain_values(critic_path, batch)).abs().max().item()
    }
    out["losses"] = [step["loss"] for step in value_steps(critic, batch, 3)]
    out["world"] = dist.get_world_size()
    critic.shutdown()
    return out


def on_the_device(critic_path: str) -> dict:
    """`against_fsdp` on this process's platform (a GPU's), fp32 compute."""
    return {"platform": rd.current_platform().name, **against_fsdp(critic_path, mixed_precision="fp32")}
