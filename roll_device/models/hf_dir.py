"""Checks of a local Hugging Face model directory before any worker loads it: it exists, holds a
`config.json` of a causal-LM family the strategies run (Qwen2 / Qwen2.5, Qwen3, Qwen3-MoE, Llama), and a
tokenizer; what its config says of experts (`num_experts`), and of its tensors' names and shapes
(`model_shape`)."""

from __future__ import annotations

import json
from pathlib import Path

from roll_device.errors import ConfigError

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "qwen3_moe", "llama")  # Qwen2.5 checkpoints say "qwen2"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
SHAPE_KEYS = (  # the config.json keys that decide a model's tensors' names and shapes
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "num_experts",
    "num_local_experts",
    "moe_intermediate_size",
)


def check_model_dir(
    path: str | Path, setting: str = "model.path", otherwise: str = "or null for the tiny model"
) -> None:
    """A ConfigError naming `setting` (what the user set to `path`) and, for a missing folder,
    the fix `otherwise` offers besides a model directory."""
    path = Path(path).expanduser()
    if not (path / "config.json").is_file():
        what = "does not exist" if not path.exists() else "has no config.json"
        raise ConfigError(
            f"{setting}={path} {what}: give a local Hugging Face model directory (config.json, "
            f"weights, tokenizer), {otherwise}"
        )
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{setting}={path} is a '{model_type}' model: the strategies run "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} causal LMs"
        )
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"{setting}={path} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): save the tokenizer "
            "beside the model (tokenizer.save_pretrained(path))"
        )


def num_experts(config) -> int:
    """Routed experts per MoE layer of a transformers config (0: a dense model; Mixtral's configs
    say `num_local_experts`)."""
    return int(getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 0)


def model_shape(path: str | Path) -> dict | None:
    """The `SHAPE_KEYS` a model directory's config.json sets (None: the directory has none)."""
    file = Path(path).expanduser() / "config.json"
    if not file.is_file():
        return None
    config = json.loads(file.read_text())
    return {key: config[key] for key in SHAPE_KEYS if key in config}
