"""Checks of the FSDP trainer's features for real sizes, run inside spawned gloo ranks: loading
shard by shard, activation recomputation, packing, token-budget micro-batches, chunked logprobs
and optimizer offload, each against the plain path (whole load, padded rows, whole logits)."""

from __future__ import annotations

import warnings

import torch

from strategies.training.losses import grpo_policy_loss
from tests.strategies.training.data import make_batch
from tests.strategies.training.fsdp_checks import max_diff, new_trainer

PLAIN = {
    "recompute": False,
    "packing": False,
    "max_tokens_per_micro_batch": None,
    "logprob_chunk_tokens": None,
}
FEATURES = {
    "recompute": {"recompute": True},
    "packing": {"packing": True, "max_tokens_per_micro_batch": 40},
    "budget": {"max_tokens_per_micro_batch": 40},
    "chunked": {"logprob_chunk_tokens": 5},
    "offload": {"optimizer_offload": True},
    "all": {"recompute": True, "packing": True, "max_tokens_per_micro_batch": 40, "logprob_chunk_tokens": 5},
}


def mixed_batch(rank: int):
    """Rows of different real lengths (padding of 0 to 9 tokens), old logprobs off-policy."""
    batch = make_batch(seed=300 + rank, rows=4, length=16)
    for row, pad in enumerate((0, 5, 2, 9)):
        if pad:
            batch.attention_mask[row, -pad:] = 0
            batch.input_ids[row, -pad:] = 0
            batch.response_mask[row, -pad:] = 0
    noise = torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(rank))
    batch.old_logprobs = noise * 0.01 - 3.0
    return batch


def gradients(trainer) -> dict[str, torch.Tensor]:
    return {
        n: p.grad.full_tensor().clone() for n, p in trainer.model.named_parameters() if p.grad is not None
    }


def first_step(model_path: str, rank: int, changes: dict) -> dict:
    """Logprobs, then the gradients and metrics of one GRPO step, for `changes` to the plain path
    (the optimizer's zeroing is held back to read the gradients), and what FSDP2 warned of."""
    trainer = new_trainer(model_path, micro_batch_size=2, **{**PLAIN, **changes})
    batch = mixed_batch(rank)
    zero_grad = trainer.optimizer.zero_grad
    trainer.optimizer.zero_grad = lambda set_to_none=True: None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = {"logprobs": trainer.forward_logprobs(batch)}
        out["metrics"] = trainer.train_step(batch, grpo_policy_loss())
    out["fsdp_warnings"] = [str(w.message) for w in caught if "FSDP" in str(w.message)]
    out["grads"] = gradients(trainer)
    trainer.optimizer.zero_grad = zero_grad
    out["weights"] = dict(trainer.export_weights())
    trainer.shutdown()
    return out


def features(rank: int, model_path: str, names: list[str]) -> dict:
    """The logprobs, loss, gradients and updated weights of each feature in `names` (FEATURES)
    against the plain path's, and the loading check."""
    plain = first_step(model_path, rank, {})
    out = {"loading": loaded_parameters(rank, model_path)}
    for name in names:
        got = first_step(model_path, rank, FEATURES[name])
        out[name] = {
            "logprob_diff": (got["logprobs"] - plain["logprobs"]).abs().max().item(),
            "loss_diff": abs(got["metrics"]["loss"] - plain["metrics"]["loss"]),
            "entropy": plain["metrics"]["entropy"],
            "entropy_diff": abs(got["metrics"]["entropy"] - plain["metrics"]["entropy"]),
            "grad_diff": max_diff(got["grads"], plain["grads"]),
            "grad_scale": max(g.abs().max().item() for g in plain["grads"].values()),
            "weight_diff": max_diff(got["weights"], plain["weights"]),
            "fsdp_warnings": got["fsdp_warnings"],
        }
    return out


def loaded_parameters(rank: int, model_path: str) -> dict:
    """Each rank's shards after loading shard by shard (a few rows per read), against the plain
    `from_pretrained` load; its buffers too."""
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    from strategies.training import fsdp_loading

    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
    fsdp_loading.READ_BYTES = 1000  # a few rows per read: the reads' seams are checked too (this rank only)
    trainer = new_trainer(model_path)
    diffs, shard_rows, devices = [], {}, set()
    for name, param in trainer.model.named_parameters():
        assert isinstance(param, DTensor)
        full = param.full_tensor()
        devices.add(str(param.to_local().device))
        diffs.append((full.cpu() - plain[name]).abs().max().item())
        shard_rows[name] = param.to_local().shape[0]
    buffers = {n: b for n, b in trainer.model.named_buffers()}
    devices |= {str(b.device) for b in buffers.values()}
    reference_buffers = dict(AutoModelForCausalLM.from_pretrained(model_path).named_buffers())
    out = {
        "devices": sorted(devices),
        "max_diff": max(diffs),
        "buffer_diff": max((buffers[n].cpu() - reference_buffers[n]).abs().max().item() for n in buffers),
        "embedding_rows": shard_rows["model.embed_tokens.weight"],
        "vocab": plain["model.embed_tokens.weight"].shape[0],
        "names": sorted(n for n, _ in trainer.model.named_parameters()),
        "plain_names": sorted(
            n for n, _ in AutoModelForCausalLM.from_pretrained(model_path).named_parameters()
        ),
    }
    trainer.shutdown()
    return out


def megatron_step(model_path: str, rank: int, changes: dict) -> dict:
    from tests.strategies.training.megatron_checks import new_trainer as new_megatron

    trainer = new_megatron(model_path, micro_batch_size=2, **{"recompute": False, **changes})
    batch = mixed_batch(rank)
    out = {
        "logprobs": trainer.forward_logprobs(batch),
        "metrics": trainer.train_step(batch, grpo_policy_loss()),
    }
    out["weights"] = dict(trainer.export_weights())
    out["recompute"] = trainer.gpt.config.recompute_granularity
    out["micro_batches"] = len(trainer._prepare(batch))
    out["optimizer"] = type(trainer.optimizer).__name__
    trainer.shutdown()
    return out


def megatron_features(rank: int, model_path: str, changes: dict) -> dict:
    """Megatron (2 data-parallel ranks) with `changes` against its plain path: logprobs, loss,
    gradient norm and the weights after one step."""
    plain = megatron_step(model_path, rank, {})
    got = megatron_step(model_path, rank, changes)
    return {
        "logprob_diff": (got["logprobs"] - plain["logprobs"]).abs().max().item(),
        "loss_diff": abs(got["metrics"]["loss"] - plain["metrics"]["loss"]),
        "grad_norm_diff": abs(got["metrics"]["grad_norm"] - plain["metrics"]["grad_norm"]),
        "weight_diff": max_diff(got["weights"], plain["weights"]),
        "how": {k: (plain[k], got[k]) for k in ("recompute", "micro_batches", "optimizer")},
    }
