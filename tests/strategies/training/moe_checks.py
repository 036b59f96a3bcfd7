"""The FSDP2 trainer on the tiny Qwen3-MoE, in one spawned rank: loading, export names, routing
metrics, steps, and the HF engine's greedy tokens after it takes the trainer's export."""

from __future__ import annotations

import torch

import roll_device as rd
from strategies.base import SamplingConfig
from strategies.inference.hf import HfStrategy
from strategies.training.losses import nll_loss
from tests.configs import rollout_settings
from tests.strategies.training.data import make_batch
from tests.strategies.training.fsdp_checks import new_trainer, plain_logprobs

PROMPTS = [[5, 6, 7], [8, 9, 10, 11]]


def greedy(model, prompt: list[int], tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


def engine_after_update(model_path: str, exported: dict[str, torch.Tensor]) -> dict:
    """The HF engine started from the checkpoint, updated with `exported`: its greedy tokens and
    those of transformers holding `exported`, and whether the update changed the engine's."""
    from transformers import AutoModelForCausalLM

    engine = HfStrategy(rd.get_platform("cpu"))
    engine.initialize(model_path, rollout_settings("hf", max_batch_size=4, update_bucket_bytes=65536))
    sampling = SamplingConfig(n=1, max_tokens=8, temperature=0.0)
    before = [c.token_ids for c in engine.generate(PROMPTS, sampling)]
    engine.update_weights(exported.items())
    after = [c.token_ids for c in engine.generate(PROMPTS, sampling)]
    engine.shutdown()
    reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    reference.load_state_dict(exported, strict=False)  # a tied head would be the embedding: none here
    return {
        "engine_before": before,
        "engine_after": after,
        "transformers": [greedy(reference, p, 8) for p in PROMPTS],
    }


def moe_steps(rank: int, model_path: str) -> dict:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    trainer = new_trainer(model_path, router_aux_loss_coef=0.01, lr=2e-2)
    batch = make_batch(seed=3, rows=4)
    out = {
        "load_diff": (trainer.forward_logprobs(batch) - plain_logprobs(reference, batch)).abs().max().item()
    }
    out["export_names"] = [name for name, _ in trainer.export_weights()]
    out["hf_names"] = list(reference.state_dict())
    out["steps"] = [trainer.train_step(batch, nll_loss()) for _ in range(4)]
    exported = dict(trainer.export_weights())
    trainer.shutdown()
    return {**out, **engine_after_update(model_path, exported)}
