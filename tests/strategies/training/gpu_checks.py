"""Trainer checks on a real GPU: one rank over the platform's backend (NCCL on CUDA, RCCL on ROCm),
each run in a fresh process (see test_trainers_on_gpu.py and scripts/gpu-check.sh).

- `exactness`: the tiny model in fp32: logprobs against transformers on the same device, the first
  step and the losses of four against plain AdamW steps of transformers on the CPU; then
  `mixed_precision: null` (the default: bf16 on accelerators): the dtype layers compute in, the
  master weights' dtype, and the losses.
- `hosted_reference`: a second FSDP trainer in the process (the pipeline's hosted reference) starts
  equal to the policy and stays where it was while the policy steps.
- `memory`: a model of Qwen2.5-0.5B's shapes: offload moves every parameter and optimizer state off
  the device and reload brings the same bytes back, `mem_get_info` shows both, and the model
  computes the same logprobs after the round trip.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import roll_device as rd
from strategies.base import TrainBatch
from strategies.registry import strategy_class
from strategies.training.losses import masked_mean, nll_loss
from tests.strategies.training.data import make_batch
from tests.strategies.training.fsdp_checks import (
    CHANGES,
    max_diff,
    plain_logprobs,
    policy_beside_reference,
    reference_step,
    settings_of,
)

STEPS = 4

MIB = 1 << 20


def new_trainer(name: str, model_path: str, **overrides):
    platform = rd.current_platform()
    trainer = strategy_class("train", name, platform.kind)(platform)
    trainer.initialize(model_path, settings_of(name, **overrides))
    return trainer


def on_device(batch: TrainBatch, device: torch.device) -> TrainBatch:
    fields = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(batch).items()}
    return TrainBatch(**fields)


def watch_compute_dtypes(model: torch.nn.Module) -> tuple[list, set[str]]:
    """Forward hooks that collect the dtypes of the matrices that modules compute with (FSDP2
    swaps in its unsharded, cast parameters only while a module runs); remove the hooks after."""
    seen: set[str] = set()
    hooks = [
        module.register_forward_hook(lambda m, _args, _out: seen.add(str(m.weight.dtype)))
        for module in model.modules()
        if isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.dim() == 2
    ]
    return hooks, seen


def exactness(name: str, model_path: str) -> dict:
    platform = rd.current_platform()
    device = platform.device()
    batch = make_batch(seed=7)
    trainer = new_trainer(name, model_path, mixed_precision="fp32")
    plain = _plain_model(model_path, device)
    out = {
        "platform": platform.name,
        "backend": str(dist.get_backend()),
        "param_device": str(next(trainer.model.parameters()).device),
        "logprob_diff": (
            trainer.forward_logprobs(batch) - plain_logprobs(plain, on_device(batch, device)).cpu()
        )
        .abs()
        .max()
        .item(),
    }
    first = trainer.train_step(batch, nll_loss())
    ref_norm, ref_weights = reference_step(model_path, batch)
    out["grad_norm"], out["reference_grad_norm"] = first["grad_norm"], ref_norm
    out["weight_diff_vs_reference"] = max_diff(dict(trainer.export_weights()), ref_weights)
    out["fp32_losses"] = [first["loss"]] + [
        trainer.train_step(batch, nll_loss())["loss"] for _ in range(STEPS - 1)
    ]
    out["reference_losses"] = reference_losses(model_path, batch, STEPS)
    trainer.shutdown()

    mixed = new_trainer(name, model_path, mixed_precision=None)
    hooks, seen = watch_compute_dtypes(mixed.model)
    out["default_losses"] = [mixed.train_step(batch, nll_loss())["loss"] for _ in range(STEPS)]
    for hook in hooks:
        hook.remove()
    out["default_compute_dtypes"] = sorted(seen)
    out["default_master_dtypes"] = sorted({str(p.dtype) for p in _optimized(mixed)})
    mixed.shutdown()
    out["group_released"] = not dist.is_initialized()
    return out


def memory(name: str, model_path: str) -> dict:
    """Free device memory (`mem_get_info`) and this process's allocator counters, each read with
    the cache emptied, in three states: trained (after a step and a forward), offloaded, and
    reloaded (after a forward, a step and a forward again)."""
    platform = rd.current_platform()
    batch = make_batch(seed=8, rows=4, length=64)
    trainer = new_trainer(name, model_path, mixed_precision=None)
    trainer.train_step(batch, nll_loss())  # optimizer state exists from here on
    # counted right after a step, when every FSDP2 unit is sharded (an H100 run counted the root's
    # gathered bf16 embedding, 260 MiB, after a forward: forward_logprobs now reshards)
    state = {"trained": device_state_bytes(trainer, platform)}
    before = trainer.forward_logprobs(batch)
    reading = {"trained": _memory_reading(platform)}
    trainer.offload()
    platform.synchronize()
    # before this check empties the cache: what the offload itself gave back to the device
    given_back = platform.mem_get_info()[0] - reading["trained"]["free"]
    reading["offloaded"], state["offloaded"] = (
        _memory_reading(platform),
        device_state_bytes(trainer, platform),
    )
    trainer.reload()
    state["reloaded"] = device_state_bytes(trainer, platform)
    after = trainer.forward_logprobs(batch)
    step = trainer.train_step(batch, nll_loss())
    trainer.forward_logprobs(batch)  # the state "trained" was measured in: a step and a forward
    reading["reloaded"] = _memory_reading(platform)
    trainer.shutdown()
    # With the cache emptied, free + reserved is constant unless another process took or gave
    # device memory meanwhile (which would make the free-memory differences meaningless).
    device_wide = [r["free"] + r["reserved"] for r in reading.values()]
    return {
        **{f"{what}_mib": {k: r[what] // MIB for k, r in reading.items()} for what in _READING},
        "state_mib": {k: v // MIB for k, v in state.items()},
        "others_moved_mib": (max(device_wide) - min(device_wide)) // MIB,
        "offload_gave_back_mib": given_back // MIB,
        "logprobs_equal_after_reload": bool(torch.equal(before, after)),
        "loss_after_reload": step["loss"],
    }


_READING = ("free", "reserved", "allocated")


def _memory_reading(platform) -> dict[str, int]:
    """The device's free bytes and this process's reserved and allocated bytes, cache emptied."""
    platform.synchronize()
    platform.empty_cache()
    free = platform.mem_get_info()[0]
    return {
        "free": free,
        "reserved": platform.memory.memory_reserved(),
        "allocated": platform.memory_allocated(),
    }


def device_state_bytes(trainer, platform) -> int:
    """Bytes of the distinct device storages behind the model's parameters (a DTensor's local
    shard) and the optimizer's parameters and state."""
    tensors = list(trainer.model.parameters()) + _optimized(trainer)
    tensors += [
        v
        for o in _inner_optimizers(trainer)
        for entry in o.state.values()
        for v in entry.values()
        if isinstance(v, torch.Tensor)
    ]
    storages = {}
    for tensor in tensors:
        local = getattr(tensor, "_local_tensor", tensor)
        if local.device.type == platform.device_type and local.untyped_storage().nbytes():
            storages[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
    return sum(storages.values())


def reference_losses(model_path: str, batch: TrainBatch, steps: int) -> list[float]:
    """Losses of `steps` plain AdamW steps (the trainer's settings) of transformers on the CPU."""
    from transformers import AutoModelForCausalLM

    from strategies.training.fsdp import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=CHANGES["lr"], weight_decay=0.0)
    losses = []
    for _ in range(steps):
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        loss = masked_mean(
            -token_logprobs(logits, batch.input_ids, batch.attention_mask), batch.response_mask
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CHANGES["max_grad_norm"])
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _plain_model(model_path: str, device: torch.device):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()


def _inner_optimizers(trainer) -> list[torch.optim.Optimizer]:
    """The torch optimizers behind the trainer's (Megatron chains and wraps them; FSDP's is one)."""
    optimizer = trainer.optimizer
    return [getattr(o, "optimizer", o) for o in getattr(optimizer, "chained_optimizers", [optimizer])]


def _optimized(trainer) -> list[torch.Tensor]:
    return [p for o in _inner_optimizers(trainer) for group in o.param_groups for p in group["params"]]


def hosted_reference(name: str, model_path: str) -> dict:
    return policy_beside_reference(lambda: new_trainer(name, model_path), make_batch(seed=7))
