"""A model directory of another family (Qwen3, Llama) with its own tokenizer and chat template,
trained on a JSONL dataset with the math reward and evaluated: the whole pipeline (vLLM rollout,
FSDP2 trainer, weight sync, reward workers) on inputs a user brings."""

import json

import pytest

from roll_device.commands.run import run_checked
from roll_device.inputs.arithmetic import make_arithmetic_dataset
from roll_device.models.tiny import build_tokenizer, vocabulary
from tests.configs import run_config

CHAT_TEMPLATE = (
    "{% for m in messages %}<bos>{{ m['role'][0] }}:{{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<bos>a:{% endif %}"
)


def make_model_dir(path, family: str):
    """A small randomly initialised `family` model with the character tokenizer and a chat template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = {
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }[family]
    vocab = vocabulary()
    config = config_cls(
        vocab_size=len(vocab),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=vocab["<bos>"],
        eos_token_id=vocab["<eos>"],
        pad_token_id=vocab["<pad>"],
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model_cls(config).save_pretrained(path)
    tokenizer = build_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_a_users_model_and_data_run_through_the_pipeline(tmp_path, family):
    model = make_model_dir(tmp_path / family, family)
    make_arithmetic_dataset(tmp_path / "train.jsonl", tmp_path / "test.jsonl")
    cfg = run_config(
        f"model.path={model}",
        f"data.path={tmp_path / 'train.jsonl'}",
        f"data.eval_path={tmp_path / 'test.jsonl'}",
        "eval.size=4",
        "eval.every_n_steps=2",
        "reward.function=math",
        "data.epochs=1",
        "data.prompts_per_step=45",
        "algorithm.samples_per_prompt=2",
        "algorithm.max_new_tokens=4",
        "algorithm.kl_coef=0",
        "max_steps=5",
        "save_every=0",
    )  # 90 training problems, 45 a step: one epoch is 2 steps, so the run ends after step 2
    run_dir = run_checked(cfg, tmp_path / "run")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], "eval_pass@1" in r) for r in records] == [
        (0, True),
        (1, False),
        (2, False),
        (2, True),
    ]
    assert [r["weights_version"] for r in records if "reward_mean" in r] == [1, 2]
    assert all(r["rollout_vs_train_logprob_gap"] < 0.05 for r in records if "reward_mean" in r)
    state = json.loads((run_dir / "checkpoints" / "step_2" / "pipeline.json").read_text())
    assert state["data_position"] == 90 and state["data_epoch"] == 1
