"""Trainer checkpoints for the export tests, written in spawned gloo ranks: one GRPO step, then
`save_checkpoint`; each rank returns what the trainer computes afterwards (logprobs of a batch
and its exported weights) for the exported model to be compared with. And, in this process in a
second or two, a run directory as the pipeline leaves it: committed checkpoints (the manifest
resume verifies) whose policy holds the model's tensors under the names the FSDP trainer writes."""

from __future__ import annotations

from pathlib import Path

import yaml

from roll_device.pipeline.state import POLICY_DIR, RUN_CONFIG_FILE, Checkpoints, PipelineState
from strategies.training.losses import nll_loss
from tests.strategies.training import fsdp_checks, megatron_checks
from tests.strategies.training.data import make_batch

TRAINERS = {"fsdp": fsdp_checks.new_trainer, "megatron": megatron_checks.new_trainer}


def saved_after_a_step(rank: int, model_path: str, directory: str, name: str, layout: dict) -> dict:
    trainer = TRAINERS[name](model_path, **layout)
    trainer.train_step(make_batch(seed=50), nll_loss())  # the same rows on every rank
    trainer.save_checkpoint(directory)
    # numpy arrays: they pickle by value (a tensor would go by a shared-memory handle that dies with the rank)
    out = {
        "logprobs": trainer.forward_logprobs(make_batch(seed=51)).numpy(),
        "weights": {name: tensor.numpy() for name, tensor in trainer.export_weights()},
    }
    trainer.shutdown()
    return out


def vllm_greedy(model_dir: str, prompt: str) -> dict:
    """Greedy tokens of vLLM (in-process, eager) on an exported model directory."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, enforce_eager=True, dtype="float32", kv_cache_memory_bytes=64 * 2**20, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompt_ids = [int(t) for t in prompt.split(",")]
    (result,) = llm.generate([{"prompt_token_ids": prompt_ids}], params)
    return {"tokens": list(result.outputs[0].token_ids)}


def committed_run(run_dir: Path, model_path: str, steps: int) -> Path:
    """`run_dir` with checkpoints of steps 1..`steps` of the model at `model_path`, each the
    model's weights (scaled by the step, so that checkpoints differ) in torch.distributed.checkpoint
    files, and the run's config.yaml naming the model."""
    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    weights = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
    checkpoints = Checkpoints(run_dir)
    for step in range(1, steps + 1):
        staging = checkpoints.staging_dir(step)
        state = {f"model.{name}": tensor * (1 + step / 10) for name, tensor in weights.items()}
        dcp.save(state, checkpoint_id=staging / POLICY_DIR, no_dist=True)
        checkpoints.commit(staging, PipelineState(step=step))
    model = {
        "path": model_path,
        "tiny_dir": "unused",
        "tiny_layers": 2,
        "tiny_hidden": 128,
        "chat_template": False,
    }
    (run_dir / RUN_CONFIG_FILE).write_text(yaml.safe_dump({"model": model}))
    return run_dir
