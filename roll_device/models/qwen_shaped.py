"""A randomly initialised causal LM with the shapes of a Qwen model (Qwen2.5 0.5B or 1.5B, or the
mixture of experts Qwen3-30B-A3B; any number of its layers), saved in Hugging Face format: a
realistic size for memory and speed measurements, no download. Qwen3-30B-A3B's 48 layers hold
30.5B parameters (120 GB in fp32): by default it is cut to CUT_LAYERS of them.

With `tokenizer=True` the character tokenizer of `tiny.py` is saved beside it, stretched over the
whole vocabulary (151,936 entries: the characters first, then placeholder tokens), so that the
GRPO pipeline can run the model end to end (`roll-device make-tiny-model PATH --shapes qwen2.5-0.5b`).
"""

from __future__ import annotations

import json
from pathlib import Path

_QWEN2_5_COMMON = {
    "model_type": "qwen2",
    "vocab_size": 151936,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
# the shapes each name stands for, from the models' published config.json
QWEN_SHAPES = {
    "qwen2.5-0.5b": {
        **_QWEN2_5_COMMON,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
    },
    "qwen2.5-1.5b": {
        **_QWEN2_5_COMMON,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_attention_heads": 12,
        "num_hidden_layers": 28,
    },
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "router_aux_loss_coef": 0.001,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_hidden_layers": 48,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
}
# the layers made unless --layers says otherwise, where the model's own would not fit a 24 GB host:
# two of Qwen3-30B-A3B's layers are 1.2B parameters beside the 0.6B of embedding and head (7.5 GB)
CUT_LAYERS = {"qwen3-30b-a3b": 2}
DEFAULT_SHAPES = "qwen2.5-0.5b"
MARKER = "roll_device_qwen_shaped.json"


def qwen_shaped_config(num_layers: int | None = None, shapes: str = DEFAULT_SHAPES):
    """The transformers config of `shapes` (a key of QWEN_SHAPES), with `num_layers` decoder layers
    if given, else its CUT_LAYERS or the model's own."""
    from transformers import AutoConfig

    config = dict(QWEN_SHAPES[shapes])
    model_type = config.pop("model_type")
    default = CUT_LAYERS.get(shapes, config["num_hidden_layers"])
    layers = default if num_layers is None else num_layers
    return AutoConfig.for_model(model_type, **{**config, "num_hidden_layers": layers}, torch_dtype="float32")


def make_qwen_shaped_model(
    path: str | Path,
    num_layers: int | None = None,
    seed: int = 0,
    tokenizer: bool = False,
    shapes: str = DEFAULT_SHAPES,
) -> Path:
    """Write a freshly initialised fp32 model of `shapes` (a key of QWEN_SHAPES) to `path` (reused
    when present with the same settings), with the character tokenizer when `tokenizer`. Returns
    the path."""
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    settings = {"seed": seed, "num_layers": num_layers, "tokenizer": tokenizer, "shapes": shapes}
    marker = path / MARKER
    if marker.exists() and json.loads(marker.read_text()) == settings:
        return path
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = qwen_shaped_config(num_layers, shapes)
    if tokenizer:
        from roll_device.models.tiny import build_tokenizer, special_token_ids

        config.update(special_token_ids())
        build_tokenizer(vocab_size=config.vocab_size).save_pretrained(path)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(
        path, safe_serialization=True
    )
    marker.write_text(json.dumps(settings))
    return path
