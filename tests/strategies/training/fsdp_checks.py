"""FSDP2 checks run inside spawned ranks (strategies/training/local_ranks.py) or a fresh process (the
simulated NPU)."""

from __future__ import annotations

import torch
import torch.distributed as dist

import roll_device as rd
from strategies.host_turns import HostTurn
from strategies.registry import strategy_class
from strategies.training.fsdp import token_logprobs
from strategies.training.losses import LossSpec, grpo_policy_loss, masked_mean, nll_loss, policy_loss
from tests.configs import trainer_settings
from tests.isolated import error_of, simulated_npu
from tests.strategies.training.data import concat, make_batch
from tests.strategies.training.in_place_checks import point_to_point_calls

CHANGES = {"lr": 5.0e-3, "micro_batch_size": 1, "max_grad_norm": 1.0}  # to the shipped trainer sections


def settings_of(name: str = "fsdp", **overrides):
    """The shipped `trainer=<name>` section with these tests' CHANGES and `overrides`."""
    return trainer_settings(name, **{**CHANGES, **overrides})


def new_trainer(model_path: str, **overrides):
    platform = rd.current_platform()
    trainer = strategy_class("train", "fsdp", platform.kind)(platform)
    trainer.initialize(model_path, settings_of(**overrides))
    return trainer


def plain_logprobs(model, batch) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return token_logprobs(logits, batch.input_ids, batch.attention_mask)


def reference_step(model_path: str, batch):
    """One plain (unsharded) AdamW step with the trainer's settings on the whole batch."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=CHANGES["lr"], weight_decay=0.0)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logprobs = token_logprobs(logits, batch.input_ids, batch.attention_mask)
    masked_mean(-logprobs, batch.response_mask).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CHANGES["max_grad_norm"])
    optimizer.step()
    return float(grad_norm), {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def turn_round_trip(trainer, batch) -> dict:
    """Two colocated turns (offload, reload) after steps: the shards, gradients and Adam state
    bit-identical after each, the host buffer allocated once, its storages empty while offloaded.
    On the CPU kind, where a kept turn moves nothing, through the copy path a device kind takes."""
    if trainer.platform.is_host:
        trainer.turn = HostTurn(trainer.platform, copies=True)
    state = [t.detach().clone() for t in trainer._device_tensors()]
    out = {"optimizer_state_tensors": sum(len(s) for s in trainer.optimizer.state.values())}
    buffers = []
    for turn in range(2):
        trainer.offload()
        held = [t for t in trainer._device_tensors() if trainer.platform.is_device_tensor(t)]
        out["offloaded_bytes"] = sum(t.untyped_storage().nbytes() for t in held)
        if turn == 0:
            out["offloaded_error"] = error_of(lambda: trainer.forward_logprobs(batch))
        trainer.reload()
        buffers.append(trainer.turn.buffer.data_ptr())
        after = list(trainer._device_tensors())
        out[f"identical_after_turn_{turn}"] = len(after) == len(state) and all(
            torch.equal(a, b) for a, b in zip(state, after)
        )
    out["host_allocations"], out["same_host_buffer"] = trainer.turn.allocations, buffers[0] == buffers[1]
    return out


def two_ranks(rank: int, model_path: str, checkpoint_dir: str) -> dict:
    """The FSDP2 contract on 2 gloo ranks, each with its own rows."""
    from transformers import AutoConfig, AutoModelForCausalLM

    world = dist.get_world_size()
    batch = make_batch(seed=100 + rank)
    out = {}
    trainer = new_trainer(model_path)
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    out["logprob_diff"] = (trainer.forward_logprobs(batch) - plain_logprobs(plain, batch)).abs().max().item()
    out["parameter_types_after_forward"] = sorted({type(p).__name__ for p in trainer.model.parameters()})

    first = trainer.train_step(batch, nll_loss())
    ref_norm, ref_weights = reference_step(model_path, concat([make_batch(100 + r) for r in range(world)]))
    out["grad_norm"], out["reference_grad_norm"] = first["grad_norm"], ref_norm
    out["weight_diff_vs_reference"] = max_diff(dict(trainer.export_weights()), ref_weights)
    out["losses"] = [first["loss"]] + [trainer.train_step(batch, nll_loss())["loss"] for _ in range(3)]

    exported = dict(trainer.export_weights())
    out["exported_names"] = sorted(exported)
    out["hf_names"] = sorted(plain.state_dict())
    with point_to_point_calls() as calls:  # a weight sync's export: bf16 engine, rank 0 sends
        for_sync = list(trainer.export_weights(dtype=torch.bfloat16, snapshot=False, to_rank=0))
    out["sync_export_names"] = sorted(name for name, _ in for_sync)
    out["sync_export_matches"] = all(
        torch.equal(tensor, exported[name].bfloat16()) if rank == 0 else tensor is None
        for name, tensor in for_sync
    )
    out["sync_export_calls"] = sorted(set(calls))
    fresh = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    fresh.load_state_dict(exported, strict=True)
    out["export_logprob_diff"] = (
        (plain_logprobs(fresh, batch) - trainer.forward_logprobs(batch)).abs().max().item()
    )

    out["uneven_error"] = error_of(lambda: trainer.forward_logprobs(make_batch(seed=1, rows=2 + rank)))
    out.update(turn_round_trip(trainer, batch))

    rl_batch = make_batch(seed=200 + rank)
    rl_batch.old_logprobs = trainer.forward_logprobs(rl_batch)
    trainer.save_checkpoint(checkpoint_dir)
    loss = grpo_policy_loss(clip_ratio=0.2)
    after_save = trainer.train_step(rl_batch, loss)
    weights_after_save = dict(trainer.export_weights())
    restored = new_trainer(model_path)
    restored.load_checkpoint(checkpoint_dir)
    after_load = restored.train_step(rl_batch, loss)
    out["step_after_save"], out["step_after_load"] = after_save, after_load
    out["checkpoint_weight_diff"] = max_diff(weights_after_save, dict(restored.export_weights()))
    for t in (restored, trainer):
        t.shutdown()
    out["hosted_reference"] = policy_beside_reference(lambda: new_trainer(model_path), batch)
    return out


def policy_beside_reference(make_trainer, batch) -> dict:
    """Two trainers in one process over one process group, as a hosted reference runs beside the
    policy (roll_device/pipeline/roles.py): they start equal, and the policy's steps leave the
    reference where it was."""
    policy, reference = make_trainer(), make_trainer()
    start = reference.forward_logprobs(batch)
    out = {
        "backend": str(dist.get_backend()),
        "start_diff": (policy.forward_logprobs(batch) - start).abs().max().item(),
    }
    for _ in range(2):
        policy.train_step(batch, nll_loss())
    out["reference_moved"] = (reference.forward_logprobs(batch) - start).abs().max().item()
    out["policy_moved"] = (policy.forward_logprobs(batch) - start).abs().max().item()
    for trainer in (reference, policy):
        trainer.shutdown()
    return out


def simulated_npu_step(model_path: str) -> dict:
    """One rank of FSDP2 on the simulated NPU (its hccl stand-in over gloo): logprobs and steps
    against the same trainer on the CPU, with an offload and reload before the fourth step. A
    simulation, labelled so."""
    platform = simulated_npu()
    batch = make_batch(seed=7)
    settings = {"mixed_precision": "fp32", "attn_implementation": "eager"}
    npu = new_trainer(model_path, **settings)
    param = next(npu.model.parameters())
    out = {
        "platform": platform.name,
        "backend": str(dist.get_backend()),
        "param_type": type(param).__name__,
        "param_device": str(param.device),
    }
    logprobs = npu.forward_logprobs(batch)
    out["npu_losses"] = [npu.train_step(batch, nll_loss())["loss"] for _ in range(3)]
    before = platform.memory_allocated()
    npu.offload()
    out["allocated_before_offload"], out["allocated_after_offload"] = before, platform.memory_allocated()
    out["param_device_offloaded"] = str(next(npu.model.parameters()).device)
    out["param_bytes_offloaded"] = next(npu.model.parameters()).to_local().untyped_storage().nbytes()
    npu.reload()
    out["param_device_reloaded"] = str(next(npu.model.parameters()).device)
    out["allocated_after_reload"] = platform.memory_allocated()
    out["npu_losses"].append(npu.train_step(batch, nll_loss())["loss"])
    out["turns"] = turn_round_trip(npu, batch)
    npu.shutdown()

    cpu = strategy_class("train", "fsdp", "cpu")(rd.get_platform("cpu"))
    cpu.initialize(model_path, settings_of(**settings))
    out["logprob_diff_vs_cpu"] = (cpu.forward_logprobs(batch) - logprobs).abs().max().item()
    out["cpu_losses"] = [cpu.train_step(batch, nll_loss())["loss"] for _ in range(4)]
    return out


def kept_export_after_a_step(model_path: str) -> dict:
    """An export kept across a train step (it must not follow the step)."""
    trainer = new_trainer(model_path)
    kept = dict(trainer.export_weights())
    before = {name: tensor.clone() for name, tensor in kept.items()}
    trainer.train_step(make_batch(seed=7), nll_loss())
    after = dict(trainer.export_weights())
    trainer.shutdown()
    return {"kept_changed": max_diff(kept, before), "weights_moved": max_diff(after, before)}


def seq_mean_over_micro_batches(model_path: str) -> dict:
    """A seq-mean-token-mean step in micro-batches of 1 row and in one of 4 rows (rows of
    different response lengths): the loss and gradient are those of the whole batch either way."""
    batch = make_batch(seed=11, rows=4)
    loss = policy_loss(LossSpec(loss_agg="seq-mean-token-mean"))
    out = {}
    for size in (1, 4):
        trainer = new_trainer(model_path, micro_batch_size=size)
        out[f"rows_{size}"] = trainer.train_step(batch, loss)
        trainer.shutdown()
    return out


def entropy_bonus(model_path: str) -> dict:
    """With zero advantages the only gradient is the entropy bonus's; steps with
    `entropy_coef` > 0 raise the policy's entropy, and without it nothing moves."""
    batch = make_batch(seed=5, rows=4)
    batch.advantages = torch.zeros(4)
    out = {}
    for coef in (0.0, 1.0):
        trainer = new_trainer(model_path, lr=1e-4)
        out[f"coef_{coef}"] = [
            trainer.train_step(batch, policy_loss(LossSpec(entropy_coef=coef))) for _ in range(3)
        ]
        trainer.shutdown()
    return out


def one_rank(rank: int, model_path: str) -> dict:
    """The checks one CPU rank answers, in one process (each starts trainers of its own)."""
    return {
        "kept_export": kept_export_after_a_step(model_path),
        "seq_mean": seq_mean_over_micro_batches(model_path),
        "entropy": entropy_bonus(model_path),
    }
