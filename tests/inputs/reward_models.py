"""Tiny reward models for the tests: a Qwen2ForSequenceClassification with one label on the tiny
character tokenizer, random (`make_reward_model`), or built so that its score is known
(`make_last_digit_reward_model`: 1 when the conversation's last token is a digit, else 0)."""

from __future__ import annotations

import math

import torch

from roll_device.models.tiny import build_config, build_tokenizer, vocabulary

HIDDEN = 64


def _new_model(seed: int = 0, norm_eps: float = 1e-6):
    """The tiny Qwen2's architecture (roll_device/models/tiny.py) with a one-label head."""
    from transformers import Qwen2ForSequenceClassification

    config = build_config(num_layers=2, hidden_size=HIDDEN)
    config.num_labels, config.rms_norm_eps = 1, norm_eps
    torch.manual_seed(seed)
    return Qwen2ForSequenceClassification(config)


def _save(model, path, chat_template: str | None):
    model.save_pretrained(path)
    tokenizer = build_tokenizer()
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(path)
    return str(path)


def make_reward_model(path, chat_template: str | None = None, seed: int = 0) -> str:
    """A randomly initialised tiny reward model in `path` (its tokenizer's template: `chat_template`)."""
    return _save(_new_model(seed), path, chat_template)


@torch.no_grad()
def make_last_digit_reward_model(path) -> str:
    """A reward model whose score is 1.0 when the last token is a digit, else 0.0: its layers add
    nothing to the residual stream (their output projections are zero), so the last position's
    final hidden state is the normalised embedding of the last token; digits embed along one axis,
    every other token along another, and the head reads the digits' axis."""
    model = _new_model(norm_eps=0.0)  # the scores exactly 1.0 and 0.0
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    embedding = model.model.embed_tokens.weight
    embedding.zero_()
    embedding[:, 0] = 1.0
    digits = [index for token, index in vocabulary().items() if token.isdigit()]
    embedding[digits, 0], embedding[digits, 1] = 0.0, 1.0
    model.model.norm.weight.fill_(1.0)
    model.score.weight.zero_()
    model.score.weight[0, 1] = 1.0 / math.sqrt(HIDDEN)  # RMSNorm scales a one-hot row to sqrt(hidden)
    return _save(model, path, None)
