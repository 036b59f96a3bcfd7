"""vLLM serving a LoRA policy on the CPU (slow-marked: an engine with `enable_lora` of its own): the
trainer's adapter-only syncs (the engine's base is the checkpoint it loaded), through the
engine's weight-transfer API with verification; the engine's hash covers both, and its greedy
tokens equal PEFT's on the same adapter."""

from __future__ import annotations

import pytest
import torch

import roll_device as rd
from roll_device.comm import weights_hash
from strategies.base import SamplingConfig
from strategies.inference.adapters import write_peft_folder
from strategies.inference.vllm import VllmStrategy
from strategies.training.fsdp import FsdpTrainStrategy
from strategies.training.losses import policy_loss
from tests.configs import rollout_settings, run_config, trainer_settings
from tests.strategies.training.data import make_batch

LORA = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": "all-linear"}
PROMPT = [3, 4, 5, 6, 7]


def _steps(trainer, count: int) -> None:
    batch = make_batch(0, rows=4)
    for _ in range(count):
        batch.old_logprobs = trainer.forward_logprobs(batch)
        batch.ref_logprobs = trainer.base_logprobs(batch)
        trainer.train_step(batch, policy_loss(run_config().algorithm.loss_spec()))


@pytest.mark.slow
def test_vllm_serves_the_synced_adapter_as_peft_does(tiny_model_path, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cpu = rd.get_platform("cpu")
    trainer = FsdpTrainStrategy(cpu)
    trainer.initialize(tiny_model_path, trainer_settings("fsdp", lora=LORA))
    engine = VllmStrategy(cpu)
    engine.use_adapters(trainer.settings.lora)
    engine.initialize(
        tiny_model_path, rollout_settings("vllm", max_num_seqs=16, kv_cache_bytes=2**26, dtype="float32")
    )
    try:
        greedy = SamplingConfig(n=1, max_tokens=8, temperature=0.0)
        for _ in range(2):  # the adapters alone from the first sync: the engine loaded the base
            _steps(trainer, 3)
            engine.update_weights(trainer.export_adapters())
            assert engine.weights_hash() == weights_hash(trainer.export_weights())
        served = engine.generate([PROMPT], greedy)[0].token_ids
        write_peft_folder(str(tmp_path), dict(trainer.export_adapters()), LORA["alpha"])
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        adapted = PeftModel.from_pretrained(base, str(tmp_path)).eval()
        expected = adapted.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False)[
            0, len(PROMPT) :
        ]
        assert served == expected.tolist()
    finally:
        engine.shutdown()
        trainer.shutdown()
