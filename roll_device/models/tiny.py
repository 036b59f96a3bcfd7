"""A tiny causal LM and a character tokenizer, made locally and saved in Hugging Face format
(loadable by transformers, vLLM and the training strategies). Three architectures, each built with
transformers' own config class (ARCHITECTURES): Qwen2 (the default), Qwen3 (QK-norm, no attention
bias) and Qwen3-MoE (8 experts, 2 routed per token, every layer sparse).

Shapes follow what vLLM's CPU attention accepts: head size 32 (hidden 128, 4 heads, 2 KV heads).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>"]
CHARACTERS = string.digits + string.ascii_lowercase + " +-*=?.,:"
MARKER = "roll_device_tiny.json"
DIGITS_AS_LETTERS = str.maketrans(string.digits, string.ascii_lowercase[:10])


def vocabulary(size: int | None = None) -> dict[str, int]:
    """The special tokens and characters; with `size`, placeholder tokens fill the ids up to
    `size`, for a model whose embedding is larger than the character set. A placeholder's name
    spells its number in letters (`<unused_bc>` is 12): decoded, it adds no digit to a response
    (the default task's reward counts digits)."""
    tokens = SPECIAL_TOKENS + list(CHARACTERS)
    if size is not None:
        tokens += [f"<unused_{str(i).translate(DIGITS_AS_LETTERS)}>" for i in range(size - len(tokens))]
    return {tok: i for i, tok in enumerate(tokens)}


def special_token_ids() -> dict[str, int]:
    """The model config's pad, bos and eos ids for this tokenizer."""
    vocab = vocabulary()
    return {"bos_token_id": vocab["<bos>"], "eos_token_id": vocab["<eos>"], "pad_token_id": vocab["<pad>"]}


def build_tokenizer(vocab_size: int | None = None):
    """A fast tokenizer that maps each known character to one token (ids up to `vocab_size`
    filled with placeholder tokens when given)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab=vocabulary(vocab_size), unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )


# transformers' model_type -> what that architecture adds to the shared tiny shapes (a function of
# the hidden size); the experts' MLP is half the dense one, so the 2 routed experts cost one dense MLP
ARCHITECTURES = {
    "qwen2": lambda hidden: {},
    "qwen3": lambda hidden: {"head_dim": 32},  # Qwen3 configs name it; Qwen2 derives it
    "qwen3_moe": lambda hidden: {
        "head_dim": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": hidden // 2,
        "norm_topk_prob": True,  # as Qwen3-30B-A3B
    },
}
DEFAULT_ARCHITECTURE = "qwen2"


def build_config(
    num_layers: int = 2,
    hidden_size: int = 128,
    max_positions: int = 256,
    tied: bool = False,
    architecture: str = DEFAULT_ARCHITECTURE,
):
    """The transformers config of the tiny model of `architecture` (a key of ARCHITECTURES)."""
    from transformers import AutoConfig

    vocab = vocabulary()
    return AutoConfig.for_model(
        architecture,
        **ARCHITECTURES[architecture](hidden_size),
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=max(hidden_size // 64, 1),
        max_position_embeddings=max_positions,
        tie_word_embeddings=tied,  # Qwen2.5-0.5B and 1.5B tie them
        torch_dtype="float32",
        **special_token_ids(),
    )


def make_tiny_model(
    path: str | Path,
    seed: int = 0,
    num_layers: int = 2,
    hidden_size: int = 128,
    tied: bool = False,
    architecture: str = DEFAULT_ARCHITECTURE,
) -> Path:
    """Write a freshly initialized tiny model of `architecture` and its tokenizer to `path` (its
    head tied to the embedding when `tied`); reuse it if present with the same settings. Returns
    the path."""
    path = Path(path)
    settings = {"seed": seed, "num_layers": num_layers, "hidden_size": hidden_size}
    if tied:
        settings["tied"] = True  # absent when untied: models made before keep their marker
    if architecture != DEFAULT_ARCHITECTURE:
        settings["architecture"] = architecture  # likewise
    marker = path / MARKER
    if marker.exists() and json.loads(marker.read_text()) == settings:
        return path  # before the imports below: a run's start does not pay for the model's code
    import torch
    from transformers import AutoModelForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = build_config(
        num_layers=num_layers, hidden_size=hidden_size, tied=tied, architecture=architecture
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    build_tokenizer().save_pretrained(path)
    marker.write_text(json.dumps(settings))
    return path
