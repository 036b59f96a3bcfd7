"""What the trainers' features for real sizes refuse, before Ray starts, in one line: a token
budget smaller than one sample, packing where the attention cannot take packed rows, recomputation
on a model that has none, and what the Megatron trainer lacks."""

from __future__ import annotations

import json

import roll_device as rd
from strategies.training.fsdp import FsdpTrainStrategy
from strategies.training.megatron import MegatronTrainStrategy
from tests.configs import run_config, trainer_settings
from tests.refusals import one_line_refusal


def test_a_token_budget_below_the_longest_sample_is_refused():
    """tiny_grpo: prompt 6 + 1 + 8 new tokens = 15 tokens."""
    message = one_line_refusal(lambda: run_config("trainer.max_tokens_per_micro_batch=14"))
    assert message == (
        "trainer.max_tokens_per_micro_batch=14 is smaller than one sample (data.prompt_length + 1 + "
        "algorithm.max_new_tokens = 15 tokens): raise it to at least 15"
    )
    assert run_config("trainer.max_tokens_per_micro_batch=15").trainer.max_tokens_per_micro_batch == 15


def test_packing_without_a_token_budget_is_refused():
    assert one_line_refusal(lambda: trainer_settings("fsdp", packing=True)).startswith(
        "trainer.packing=true needs trainer.max_tokens_per_micro_batch"
    )


def test_packing_with_an_attention_that_cannot_take_it_is_refused(tiny_model_path):
    settings = trainer_settings(
        "fsdp", packing=True, max_tokens_per_micro_batch=64, attn_implementation="paged|sdpa"
    )
    message = one_line_refusal(lambda: FsdpTrainStrategy.check_model(None, settings, tiny_model_path))
    assert message.startswith(
        "trainer.packing=true: trainer.attn_implementation=paged|sdpa cannot take packed rows"
    )
    ok = trainer_settings("fsdp", packing=True, max_tokens_per_micro_batch=64)
    FsdpTrainStrategy.check_model(None, ok, tiny_model_path)  # sdpa takes them


def test_packing_on_megatron_is_refused():
    message = one_line_refusal(
        lambda: trainer_settings("megatron", packing=True, max_tokens_per_micro_batch=64)
    )
    assert message.startswith("trainer.packing=true: the megatron trainer's attention")


def test_chunked_logprobs_on_megatron_are_refused():
    message = one_line_refusal(lambda: trainer_settings("megatron", logprob_chunk_tokens=256))
    assert message.startswith("trainer.logprob_chunk_tokens=256: the megatron trainer computes logprobs")


def test_recomputation_on_a_model_without_it_is_refused(tmp_path):
    """JetMoe's transformers class has no gradient checkpointing."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "jetmoe"}))
    for value, shown in ((True, "true"), (None, "null (on for accelerators)")):
        settings = trainer_settings("fsdp", recompute=value)
        message = one_line_refusal(lambda s=settings: FsdpTrainStrategy.check_model(None, s, str(tmp_path)))
        assert message.startswith(f"trainer.recompute={shown}: JetMoeForCausalLM (model.path={tmp_path})")
    FsdpTrainStrategy.check_model(None, trainer_settings("fsdp", recompute=False), str(tmp_path))


def test_megatron_optimizer_offload_is_refused_on_the_cpu_and_without_the_distributed_optimizer(
    tiny_model_path,
):
    settings = trainer_settings("megatron", optimizer_offload=True)
    message = one_line_refusal(
        lambda: MegatronTrainStrategy.check_model(rd.get_platform("cpu"), settings, tiny_model_path)
    )
    assert message.startswith("trainer.optimizer_offload=true: the megatron trainer runs on cpu")
    message = one_line_refusal(
        lambda: trainer_settings("megatron", optimizer_offload=True, use_distributed_optimizer=False)
    )
    assert message.startswith("trainer.optimizer_offload=true: Megatron offloads the distributed optimizer")
