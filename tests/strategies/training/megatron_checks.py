"""Megatron-core trainer checks, run in spawned gloo ranks (ranks.py) or a fresh process."""

from __future__ import annotations

import torch
import torch.distributed as dist

import roll_device as rd
from strategies.host_turns import HostTurn
from strategies.registry import strategy_class
from strategies.training.losses import grpo_policy_loss, nll_loss
from tests.comm.shard_layouts import assembled
from tests.isolated import error_of
from tests.strategies.training.data import concat, make_batch
from tests.strategies.training.fsdp_checks import max_diff, plain_logprobs, reference_step, settings_of


def new_trainer(model_path: str, **overrides):
    platform = rd.current_platform()
    trainer = strategy_class("train", "megatron", platform.kind)(platform)
    trainer.initialize(model_path, settings_of("megatron", **overrides))
    return trainer


def checkpoint_round_trip(trainer, model_path: str, directory: str, batch, **overrides) -> dict:
    """Save, step; a fresh trainer loads and steps: both steps and weights should agree."""
    batch.old_logprobs = trainer.forward_logprobs(batch)
    loss = grpo_policy_loss(clip_ratio=0.2)
    trainer.save_checkpoint(directory)
    after_save = trainer.train_step(batch, loss)
    restored = new_trainer(model_path, **overrides)
    restored.load_checkpoint(directory)
    after_load = restored.train_step(batch, loss)
    out = {
        "step_after_save": after_save,
        "step_after_load": after_load,
        "checkpoint_weight_diff": max_diff(dict(trainer.export_weights()), dict(restored.export_weights())),
    }
    restored.shutdown()
    return out


def two_ranks(
    rank: int, model_path: str, tensor_parallel: int, pipeline_parallel: int, checkpoint_dir: str
) -> dict:
    """The trainer contract on 2 gloo ranks: TP=2 or PP=2 (both ranks hold the same rows), or
    2 data-parallel ranks (each its own rows) with the distributed optimizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    layout = {"tensor_parallel": tensor_parallel, "pipeline_parallel": pipeline_parallel}
    dp_size = dist.get_world_size() // (tensor_parallel * pipeline_parallel)
    seeds = [100 + r for r in range(dp_size)]
    batch = make_batch(seed=seeds[rank % dp_size] if dp_size > 1 else seeds[0])
    trainer = new_trainer(model_path, **layout)
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    out = {
        "logprob_diff": (trainer.forward_logprobs(batch) - plain_logprobs(plain, batch)).abs().max().item()
    }
    out["data_parallel"] = [trainer.data_parallel_rank, trainer.data_parallel_size]

    first = trainer.train_step(batch, nll_loss())
    ref_norm, ref_weights = reference_step(model_path, concat([make_batch(s) for s in seeds]))
    out["grad_norm"], out["reference_grad_norm"] = first["grad_norm"], ref_norm
    out["weight_diff_vs_reference"] = max_diff(dict(trainer.export_weights()), ref_weights)
    out["losses"] = [first["loss"]] + [trainer.train_step(batch, nll_loss())["loss"] for _ in range(3)]

    exported = dict(trainer.export_weights())
    out["exported_names"], out["hf_names"] = sorted(exported), hf_names(plain)
    out.update(sharded_export(trainer, exported))
    for_sync = list(trainer.export_weights(dtype=torch.bfloat16, snapshot=False, to_rank=1))
    out["sync_export_names"] = sorted(name for name, _ in for_sync)
    out["sync_export_matches"] = all(
        torch.equal(tensor.cpu(), exported[name].bfloat16()) if rank == 1 else tensor is None
        for name, tensor in for_sync
    )
    fresh = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    fresh.load_state_dict(exported, strict=True)
    out["export_logprob_diff"] = (
        (plain_logprobs(fresh, batch) - trainer.forward_logprobs(batch)).abs().max().item()
    )
    trainer.offload()
    trainer.reload()
    out["offload_reload_weight_diff"] = max_diff(exported, dict(trainer.export_weights()))
    out["own_rows_error"] = error_of(lambda: trainer.forward_logprobs(make_batch(seed=rank)))
    out.update(checkpoint_round_trip(trainer, model_path, checkpoint_dir, make_batch(seed=300), **layout))
    trainer.shutdown()
    other = new_trainer(model_path, tensor_parallel=1 if tensor_parallel * pipeline_parallel > 1 else 2)
    out["layout_error"] = error_of(lambda: other.load_checkpoint(checkpoint_dir))
    other.shutdown()
    return out


def sharded_export(trainer, exported: dict) -> dict:
    """Every rank's `export_shards` (gathered here for the check; a sync moves them over links of
    their own) placed at their boxes, against the whole export; this rank's slice bytes and the
    bytes the sharded sync's plan has each rank send."""
    mine = [(name, part.detach().clone(), shard) for name, part, shard in trainer.export_shards()]
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    full, plan = assembled(ranks)
    return {
        "sharded_names": sorted(full),
        "sharded_export_diff": max_diff(full, exported),
        "slice_bytes": sum(part.numel() * part.element_size() for _, part, _ in mine),
        "planned_bytes": [plan.sent_bytes(rank) for rank in range(len(ranks))],
        "whole_bytes": sum(t.numel() * t.element_size() for t in exported.values()),
    }


def single_process(model_path: str, checkpoint_dir: str) -> dict:
    """No process group given: each trainer makes (or joins) a single-rank one. Megatron TP=1 with
    the plain (non-distributed) optimizer against FSDP2 on the same weights (weight decay on, so
    that both must decay the same parameters: norms are at 1.0, a decayed norm moves by lr * 0.1),
    offload and reload."""
    batch = make_batch(seed=11, rows=3)
    fsdp = strategy_class("train", "fsdp", "cpu")(rd.current_platform())
    fsdp.initialize(model_path, settings_of(weight_decay=0.1))
    megatron = new_trainer(model_path, use_distributed_optimizer=False, weight_decay=0.1)
    twin = new_trainer(model_path, use_distributed_optimizer=False, weight_decay=0.1)
    out = {
        "logprob_diff_vs_fsdp": (fsdp.forward_logprobs(batch) - megatron.forward_logprobs(batch))
        .abs()
        .max()
        .item()
    }
    fsdp_step, megatron_step = fsdp.train_step(batch, nll_loss()), megatron.train_step(batch, nll_loss())
    twin.train_step(batch, nll_loss())
    out["fsdp_step"], out["megatron_step"] = fsdp_step, megatron_step
    out["weight_diff_vs_fsdp"] = max_diff(dict(fsdp.export_weights()), dict(megatron.export_weights()))

    param = next(megatron.model.module.parameters())
    megatron.turn = HostTurn(
        megatron.platform, copies=True
    )  # the path a device takes (the CPU moves nothing)
    megatron.offload()
    out["storage_bytes_offloaded"] = param.untyped_storage().nbytes()
    out["offloaded_error"] = error_of(lambda: megatron.train_step(batch, nll_loss()))
    megatron.reload()
    out["storage_bytes_reloaded"] = param.untyped_storage().nbytes()
    after_reload, twin_step = megatron.train_step(batch, nll_loss()), twin.train_step(batch, nll_loss())
    out["step_after_reload"], out["step_without_offload"] = after_reload, twin_step
    out["reload_weight_diff"] = max_diff(dict(megatron.export_weights()), dict(twin.export_weights()))
    out.update(
        checkpoint_round_trip(
            megatron,
            model_path,
            checkpoint_dir,
            make_batch(seed=12),
            use_distributed_optimizer=False,
            weight_decay=0.1,
        )
    )
    for trainer in (twin, megatron):
        trainer.shutdown()
    fsdp.shutdown()
    out.update(bf16_steps(model_path))
    out["group_released"] = not dist.is_initialized()
    return out


def bf16_steps(model_path: str) -> dict:
    """mixed_precision=bf16 on both trainers (on the CPU too): the same loss to bf16 precision."""
    batch = make_batch(seed=13)
    fsdp = strategy_class("train", "fsdp", "cpu")(rd.current_platform())
    fsdp.initialize(model_path, settings_of(mixed_precision="bf16"))
    megatron = new_trainer(model_path, mixed_precision="bf16")
    out = {
        "bf16_fsdp_losses": [fsdp.train_step(batch, nll_loss())["loss"] for _ in range(2)],
        "bf16_megatron_losses": [megatron.train_step(batch, nll_loss())["loss"] for _ in range(2)],
        "bf16_megatron_export_dtypes": sorted({str(t.dtype) for _, t in megatron.export_weights()}),
    }
    megatron.shutdown()
    fsdp.shutdown()
    return out


def make_tied_llama(directory: str) -> dict:
    """A tiny Llama (4 layers) with tied embeddings and no QKV bias, saved to `directory`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from roll_device.models.tiny import build_tokenizer, vocabulary

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocabulary()),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    return {"path": directory}


def llama_tied(directory: str) -> dict:
    """The tied Llama on one process: Megatron against transformers and FSDP2."""
    from transformers import AutoModelForCausalLM

    make_tied_llama(directory)
    batch = make_batch(seed=21)
    megatron = new_trainer(directory)
    fsdp = strategy_class("train", "fsdp", "cpu")(rd.current_platform())
    fsdp.initialize(directory, settings_of())
    plain = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    out = {
        "logprob_diff": (megatron.forward_logprobs(batch) - plain_logprobs(plain, batch)).abs().max().item(),
        "megatron_step": megatron.train_step(batch, nll_loss()),
        "fsdp_step": fsdp.train_step(batch, nll_loss()),
    }
    exported = dict(megatron.export_weights())
    out["exported_names"], out["hf_names"] = sorted(exported), hf_names(plain)
    fsdp_weights = dict(fsdp.export_weights())
    out["weight_diff_vs_fsdp"] = max_diff(fsdp_weights, exported)
    out["weights_off_fraction"] = weights_off_fraction(exported, fsdp_weights)
    megatron.shutdown()
    fsdp.shutdown()
    return out


def hf_names(model) -> list[str]:
    """The names a trainer exports `model`'s weights under: a tied head is the embedding, once."""
    from strategies.tied_weights import state_once

    return sorted(state_once(model))


def weights_off_fraction(a: dict, b: dict, tolerance: float = 1e-5) -> float:
    """Share of the elements of `a` that differ from `b` by more than `tolerance`."""
    off = sum(int(((a[k] - b[k]).abs() > tolerance).sum()) for k in a)
    return off / sum(t.numel() for t in a.values())


def llama_tied_pipeline(rank: int, directory: str, checkpoint: str) -> dict:
    """The tied Llama over 2 pipeline stages: the embedding on the first, its copy in the output
    layer on the last, their gradients summed by Megatron. Against a plain step on one process;
    the trained state is saved to `checkpoint` (for `roll-device export`)."""
    from transformers import AutoModelForCausalLM

    batch = make_batch(seed=22)
    trainer = new_trainer(directory, pipeline_parallel=2)
    plain = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    out = {
        "logprob_diff": (trainer.forward_logprobs(batch) - plain_logprobs(plain, batch)).abs().max().item(),
        "layers_held": sum(1 for n, _ in trainer.gpt.named_parameters() if n.endswith("linear_qkv.weight")),
        "step": trainer.train_step(batch, nll_loss()),
    }
    ref_norm, ref_weights = reference_step(directory, batch)
    exported = dict(trainer.export_weights())
    out["reference_grad_norm"] = ref_norm
    out["exported_names"], out["hf_names"] = sorted(exported), hf_names(plain)
    out["weight_diff_vs_reference"] = max_diff(exported, ref_weights)
    out["weights_off_fraction"] = weights_off_fraction(exported, ref_weights)
    if trainer.stages.is_last:  # the output layer's copy of the embedding moved with it
        head = trainer.gpt.output_layer.weight.detach().cpu()
        out["head_copy_diff"] = (head - exported["model.embed_tokens.weight"]).abs().max().item()
    out["embedding"] = exported["model.embed_tokens.weight"].numpy()
    trainer.save_checkpoint(checkpoint)
    trainer.shutdown()
    return out
